//! `slowmo bench allreduce`: the exact average over real [`P2pComm`]
//! nodes, as threads of this process or (`--processes`) one process per
//! node, as gloo runs them: the others are copies of this process, started
//! with the same command line and told their part through the benchmark
//! peer variable, that print their timings for this one to gather.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use slowmo_gossip::Communicator;
use slowmo_gossip::compress::{Compression, compressed_average};
use slowmo_gossip::p2p::{DataLane, P2pComm, P2pConfig};

use super::bench::{PEER_ENV, gbits, p2p_config};

/// What every measurement of one `slowmo bench allreduce` shares.
pub(super) struct Bench {
    pub nodes: usize,
    pub chunk: Option<usize>,
    pub repeats: usize,
    pub transport: String,
    pub lane: DataLane,
    pub k: usize,
    pub processes: bool,
    pub json: bool,
}

/// One measurement: a size, a codec and a schedule.
#[derive(Debug, Clone, Copy)]
struct Setting {
    floats: usize,
    codec: Compression,
    direct_max: usize,
}

impl Bench {
    /// The configuration of one node of `s`.
    fn config(&self, s: Setting) -> Result<P2pConfig> {
        let mut cfg = p2p_config(&self.transport, self.nodes, s.floats, self.lane, self.k)?;
        if let Some(chunk) = self.chunk {
            cfg = cfg.with_chunk_floats(chunk);
        }
        cfg.direct_max_bytes = s.direct_max;
        Ok(cfg)
    }

    /// The benchmark peer variable of a node of `s` that bootstraps at
    /// `boot`: everything it needs, `;`-separated.
    fn peer_spec(&self, s: Setting, boot: &[String]) -> String {
        format!(
            "allreduce;{};{};{};{};{};{};{};{};{};{}",
            self.nodes,
            s.floats,
            s.codec,
            s.direct_max,
            self.chunk.unwrap_or(0),
            self.repeats,
            self.transport,
            self.lane.name(),
            self.k,
            boot.join(",")
        )
    }
}

/// `direct_max_bytes` of the schedule asked for at the bench's command line.
fn direct_max_for(asked: &str) -> Result<usize> {
    match asked {
        "auto" => Ok(slowmo_gossip::DIRECT_MAX_BYTES),
        "ring" => Ok(0),
        "direct" => Ok(usize::MAX),
        other => bail!("unknown schedule `{other}` (expected auto, ring or direct)"),
    }
}

/// One all-reduce figure: the size, the schedule asked for and taken, and
/// the seconds of each timed repeat (as long as its slowest rank).
struct Reduced {
    floats: usize,
    codec: Compression,
    asked: String,
    schedule: &'static str,
    secs: Vec<f64>,
}

impl Reduced {
    fn median(&self) -> f64 {
        let mut sorted = self.secs.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    }
}

/// Measures every size, codec and schedule, and prints the figures.
pub(super) fn allreduce(
    b: &Bench,
    sizes: &[usize],
    schedules: &[String],
    codecs: &[Compression],
) -> Result<()> {
    if b.chunk == Some(0) {
        bail!("--chunk-floats 0: a message holds at least one float");
    }
    let (nodes, chunk, repeats, lane, k) = (b.nodes, b.chunk, b.repeats, b.lane, b.k);
    let transport = &b.transport;
    let json = b.json;
    let mut figures = Vec::new();
    for &floats in sizes {
        for (&codec, asked) in codecs
            .iter()
            .flat_map(|c| schedules.iter().map(move |s| (c, s)))
        {
            let s = Setting {
                floats,
                codec,
                direct_max: direct_max_for(asked)?,
            };
            let schedule = b.config(s)?.schedule(floats, nodes).name();
            let secs = if b.processes {
                in_processes(b, s)?
            } else {
                in_threads(b, s)?
            };
            figures.push(Reduced {
                floats,
                codec,
                asked: asked.clone(),
                schedule,
                secs,
            });
        }
    }
    let bus = |floats: usize, s: f64| {
        gbits(
            4.0 * floats as f64 * 2.0 * (nodes as f64 - 1.0) / nodes as f64,
            s,
        )
    };
    if json {
        let figures: Vec<_> = figures
            .iter()
            .map(|f| {
                let median = f.median();
                serde_json::json!({
                    "floats": f.floats,
                    "compress_average": f.codec.to_string(),
                    "schedule_asked": f.asked,
                    "schedule": f.schedule,
                    "median_seconds": median,
                    "bus_gbit_s": bus(f.floats, median),
                    "algo_gbit_s": gbits(4.0 * f.floats as f64, median),
                    "seconds": f.secs,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "bench": "allreduce",
            "nodes": nodes,
            "processes": b.processes,
            "transport": transport,
            "data_lane": lane.name(),
            "lane_connections": k,
            "chunk_floats": chunk.unwrap_or(slowmo_gossip::CHUNK_FLOATS),
            "repeats": repeats,
            "figures": figures,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "all-reduce over {nodes} nodes ({transport} control, {lane} data lane, {k} connections; \
         messages of at most {} floats; {}; median of {repeats}; \
         Gbit/s of the f32 model's bytes, whatever the codec)",
        chunk.unwrap_or(slowmo_gossip::CHUNK_FLOATS),
        if b.processes {
            "one process per node"
        } else {
            "threads of one process"
        }
    );
    println!(
        "{:>10} {:>8} {:>9} {:>7} {:>9} {:>10} {:>11} {:>11}",
        "floats", "MiB", "codec", "asked", "schedule", "median s", "bus Gbit/s", "min s"
    );
    for f in &figures {
        let median = f.median();
        let min = f.secs.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{:>10} {:>8.2} {:>9} {:>7} {:>9} {:>10.4} {:>11.2} {:>11.4}",
            f.floats,
            4.0 * f.floats as f64 / (1 << 20) as f64,
            f.codec.to_string(),
            f.asked,
            f.schedule,
            median,
            bus(f.floats, median),
            min
        );
    }
    Ok(())
}

/// Times `repeats` exact averages of `comm`'s node after one warm-up:
/// all-reduces, or compressed averages with `codec`.
fn time_averages(
    c: &mut P2pComm,
    floats: usize,
    codec: Compression,
    repeats: usize,
) -> Result<Vec<f64>> {
    let mut buf: Vec<f32> = (0..floats).map(|i| (i % 100) as f32 * 0.01).collect();
    let (anchor, mut residual) = (vec![0f32; floats], vec![0f32; floats]);
    let mut times = Vec::new();
    for k in 0..=repeats {
        let mut s = 1.0;
        c.barrier()?;
        let t = Instant::now();
        if codec.is_none() {
            // Every node's weight is 1, as in Local SGD (and as gloo's
            // script divides by the node count).
            slowmo_gossip::unit_weight_average(c, &mut buf, &mut s)?;
        } else {
            compressed_average(c, codec, &mut buf, &mut s, &anchor, &mut residual)?;
        }
        if k > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}

/// A repeat takes as long as its slowest rank.
fn slowest(per_rank: &[Vec<f64>], repeats: usize) -> Result<Vec<f64>> {
    if let Some(short) = per_rank.iter().find(|t| t.len() != repeats) {
        bail!("a node reported {} timings, not {repeats}", short.len());
    }
    Ok((0..repeats)
        .map(|k| per_rank.iter().map(|t| t[k]).fold(0.0, f64::max))
        .collect())
}

/// Shuts every node down at once: a graceful shutdown waits for the
/// peers' links to close.
fn shutdown_all(comms: Vec<P2pComm>) {
    let stops: Vec<_> = comms
        .into_iter()
        .map(|c| std::thread::spawn(move || c.shutdown()))
        .collect();
    for s in stops {
        let _ = s.join();
    }
}

/// `nodes` nodes as threads of this process.
fn in_threads(b: &Bench, s: Setting) -> Result<Vec<f64>> {
    let first = P2pComm::bind(b.config(s)?)?;
    let boot = first.listen_addrs();
    let mut handles = vec![std::thread::spawn(move || first.join())];
    for _ in 1..b.nodes {
        let cfg = b.config(s)?.with_bootstrap(boot.clone());
        handles.push(std::thread::spawn(move || P2pComm::start(cfg)));
    }
    let comms: Vec<P2pComm> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("node thread panicked"))?
                .map_err(anyhow::Error::from)
        })
        .collect::<Result<_>>()?;
    let repeats = b.repeats;
    let workers: Vec<_> = comms
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || -> Result<(P2pComm, Vec<f64>)> {
                let times = time_averages(&mut c, s.floats, s.codec, repeats)?;
                Ok((c, times))
            })
        })
        .collect();
    let mut per_rank = Vec::new();
    let mut comms = Vec::new();
    for h in workers {
        let (c, times) = h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
        per_rank.push(times);
        comms.push(c);
    }
    shutdown_all(comms);
    slowest(&per_rank, b.repeats)
}

/// The line a peer process prints its timings on.
const TIMES: &str = "slowmo-bench-times ";

/// `nodes` nodes, one per process: this one and `nodes - 1` copies.
fn in_processes(b: &Bench, s: Setting) -> Result<Vec<f64>> {
    let first = P2pComm::bind(b.config(s)?)?;
    let spec = b.peer_spec(s, &first.listen_addrs());
    let exe = std::env::current_exe().context("locating our own executable")?;
    let mut children: Vec<Child> = (1..b.nodes)
        .map(|_| {
            Command::new(&exe)
                .args(std::env::args_os().skip(1))
                .env(PEER_ENV, &spec)
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a benchmark node process")
        })
        .collect::<Result<_>>()?;
    let ours = first.join().map_err(anyhow::Error::from).and_then(|mut c| {
        let times = time_averages(&mut c, s.floats, s.codec, b.repeats);
        c.shutdown();
        times
    });
    let mut per_rank = vec![];
    let mut failed = None;
    for child in &mut children {
        let out = child.stdout.take().expect("piped");
        let line = BufReader::new(out)
            .lines()
            .map_while(|l| l.ok())
            .find_map(|l| l.strip_prefix(TIMES).map(str::to_string));
        match line.map(|l| serde_json::from_str::<Vec<f64>>(&l)) {
            Some(Ok(times)) => per_rank.push(times),
            Some(Err(e)) => failed = Some(format!("unreadable timings: {e}")),
            None => failed = Some("a node process printed no timings".to_string()),
        }
    }
    for mut child in children {
        let status = child.wait()?;
        if !status.success() && failed.is_none() {
            failed = Some(format!("a node process ended with {status}"));
        }
    }
    per_rank.push(ours?);
    if let Some(why) = failed {
        bail!("all-reduce over {} processes: {why}", b.nodes);
    }
    slowest(&per_rank, b.repeats)
}

/// A node process of [`in_processes`]: `parts` is its peer spec after
/// `allreduce`.
pub(super) fn run_peer(parts: &[&str]) -> Result<()> {
    let [
        nodes,
        floats,
        codec,
        direct_max,
        chunk,
        repeats,
        transport,
        lane,
        k,
        boot,
    ] = parts
    else {
        bail!(
            "{PEER_ENV}: an all-reduce peer takes 10 fields, not {}",
            parts.len()
        );
    };
    let chunk: usize = chunk.parse()?;
    let b = Bench {
        nodes: nodes.parse()?,
        chunk: (chunk > 0).then_some(chunk),
        repeats: repeats.parse()?,
        transport: transport.to_string(),
        lane: lane.parse().map_err(anyhow::Error::msg)?,
        k: k.parse()?,
        processes: true,
        json: false,
    };
    let s = Setting {
        floats: floats.parse()?,
        codec: codec.parse().map_err(anyhow::Error::msg)?,
        direct_max: direct_max.parse()?,
    };
    let cfg = b
        .config(s)?
        .with_bootstrap(boot.split(',').map(String::from));
    let mut comm = P2pComm::start(cfg)?;
    let times = time_averages(&mut comm, s.floats, s.codec, b.repeats);
    comm.shutdown();
    println!("{TIMES}{}", serde_json::to_string(&times?)?);
    Ok(())
}
