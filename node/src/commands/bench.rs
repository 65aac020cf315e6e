//! `slowmo bench`: how fast the libp2p communicator moves tensors (the
//! simulator's benchmark is in [`crate::commands::bench_sim`]).
//!
//! Figures are printed, never asserted. `transport` measures one link
//! between two processes (this one and a copy of itself, started with the
//! same command line and told its role through `SLOWMO_BENCH_PEER`, so the
//! child works however the command is wired into the CLI): push-sum shares
//! both ways over QUIC and over TCP + Noise + Yamux, against plain
//! unencrypted TCP sockets doing the same exchange. `allreduce`
//! ([`crate::commands::bench_allreduce`]) times the exact average over real
//! [`P2pComm`] nodes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use slowmo_gossip::compress::Compression;
use slowmo_gossip::p2p::lane::default_connections;
use slowmo_gossip::p2p::{DataLane, P2pComm, P2pConfig, RunIdentity};
use slowmo_gossip::{Communicator, PushSumRound};

/// Environment variable that turns a re-executed copy into the far end.
pub(super) const PEER_ENV: &str = "SLOWMO_BENCH_PEER";

/// Benchmarks of the network layer.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Simulator overhead: m workers in one process against the same
    /// workers computing with no communication.
    Simulator {
        /// Worker counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "8,64")]
        workers: Vec<usize>,
        /// Timed steps per worker (after a short warm-up).
        #[arg(long, default_value_t = 200)]
        steps: u64,
        /// Bases under SlowMo's defaults: ar-sgd, local-sgd, sgp, osgp.
        #[arg(long, value_delimiter = ',', default_value = "local-sgd,sgp,ar-sgd")]
        bases: Vec<slowmo_optim::Base>,
        /// Model: mlp or cnn.
        #[arg(long, default_value = "mlp")]
        model: crate::model::ModelKind,
        /// Measurements of each rate; the best counts.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// Time of one training step (forward, backward, optimizer) of each
    /// built-in model on this CPU, for the side-by-side with PyTorch
    /// (`tools/bench/torch_step.py`); one compute thread unless
    /// `RAYON_NUM_THREADS` says otherwise.
    Step {
        /// Models, comma separated: mlp, cnn, transformer.
        #[arg(long, value_delimiter = ',', default_value = "mlp,cnn,transformer")]
        models: Vec<crate::model::ModelKind>,
        /// Samples per batch [default: 32, the transformer 16 windows].
        #[arg(long)]
        batch: Option<usize>,
        /// The transformer's blocks, heads, width and context.
        #[arg(long, default_value_t = 4)]
        layers: usize,
        #[arg(long, default_value_t = 4)]
        heads: usize,
        #[arg(long, default_value_t = 256)]
        width: usize,
        #[arg(long, default_value_t = 64)]
        context: usize,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Timed steps; the median and the fastest are printed.
        #[arg(long, default_value_t = 30)]
        steps: usize,
        /// Compute device: cpu or cuda:N (a build with the `cuda` feature).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Also time each phase of the forward and backward pass (batch
        /// in, parameters in, forward, backward, gradient out), waiting for
        /// the device after each.
        #[arg(long)]
        phases: bool,
        /// Print the figures as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Throughput of one link between two processes, both directions at
    /// once: the data lane (encrypted and plaintext) with bytes only and
    /// with push-sum shares, libp2p streams (QUIC, TCP+Noise+Yamux) with
    /// push-sum shares, and plain TCP for reference.
    Transport {
        /// Message sizes in MiB.
        #[arg(long, value_delimiter = ',', default_value = "4,64,256")]
        sizes_mib: Vec<usize>,
        /// Exchanges timed per size (after one warm-up).
        #[arg(long, default_value_t = 5)]
        rounds: u64,
        /// Which links to measure: any of plain, lane, lane-plaintext, quic, tcp.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "plain,lane,lane-plaintext,quic,tcp"
        )]
        links: Vec<String>,
        /// What moves on the lane: bytes (pure transport), push-sum, or both.
        #[arg(long, default_value = "both")]
        mode: String,
        /// Lane connections per direction [default: one per core, 2 to 8].
        #[arg(long)]
        lane_connections: Option<usize>,
        /// Print the figures as one JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Time and bandwidth of the exact average over local nodes.
    Allreduce {
        /// Number of nodes (each a real libp2p node).
        #[arg(long, default_value_t = 4)]
        nodes: usize,
        /// Run each node as its own process (as gloo does), not as threads
        /// of this one.
        #[arg(long)]
        processes: bool,
        /// Floats per node (a list measures each size).
        #[arg(long, value_delimiter = ',', default_value = "10000000")]
        floats: Vec<usize>,
        /// Schedules to measure at each size: auto (what a run picks),
        /// ring, direct (falls back to the ring where a segment takes more
        /// than one message).
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        schedule: Vec<String>,
        /// Floats per all-reduce message [default: the run's, 1048576].
        #[arg(long)]
        chunk_floats: Option<usize>,
        /// Timed all-reduces (after one warm-up).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Control-plane transport: quic or tcp.
        #[arg(long, default_value = "quic")]
        transport: String,
        /// Where the chunks go: encrypted, plaintext (the data lane) or libp2p.
        #[arg(long, default_value = "encrypted")]
        data_lane: DataLane,
        /// Lane connections per direction [default: one per core, 2 to 8].
        #[arg(long)]
        lane_connections: Option<usize>,
        /// Codecs of the exact average to measure: none (the f32
        /// all-reduce) or one of --compress-average's (an all-gather of
        /// the compressed contributions, decoded and summed by every node).
        #[arg(long, value_delimiter = ',', default_value = "none")]
        compress_average: Vec<Compression>,
        /// Print the figures as one JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: BenchArgs) -> Result<()> {
    if let Ok(spec) = std::env::var(PEER_ENV) {
        return run_peer(&spec);
    }
    match args.command {
        BenchCommand::Simulator {
            workers,
            steps,
            bases,
            model,
            repeats,
        } => crate::commands::bench_sim::run(&workers, steps.max(1), &bases, model, repeats),
        BenchCommand::Step {
            models,
            batch,
            layers,
            heads,
            width,
            context,
            warmup,
            steps,
            device,
            phases,
            json,
        } => crate::commands::bench_step::run(
            &models,
            batch,
            crate::model::TransformerShape {
                layers,
                heads,
                width,
                context,
            },
            (warmup, steps),
            &crate::commands::node::parse_device(&device)?,
            phases,
            json,
        ),
        BenchCommand::Transport {
            sizes_mib,
            rounds,
            links,
            mode,
            lane_connections,
            json,
        } => transport(
            &sizes_mib,
            rounds.max(1),
            &links,
            &mode,
            lane_connections.unwrap_or_else(default_connections),
            json,
        ),
        BenchCommand::Allreduce {
            nodes,
            processes,
            floats,
            schedule,
            chunk_floats,
            repeats,
            transport,
            data_lane,
            lane_connections,
            compress_average,
            json,
        } => crate::commands::bench_allreduce::allreduce(
            &crate::commands::bench_allreduce::Bench {
                nodes,
                chunk: chunk_floats,
                repeats: repeats.max(1),
                transport,
                lane: data_lane,
                k: lane_connections.unwrap_or_else(default_connections),
                processes,
                json,
            },
            &floats,
            &schedule,
            &compress_average,
        ),
    }
}

fn identity() -> RunIdentity {
    RunIdentity {
        run_id: "bench".into(),
        config_hash: "bench".into(),
        init_hash: "bench".into(),
    }
}

fn listen_for(transport: &str) -> Result<Vec<String>> {
    Ok(match transport {
        "quic" => vec!["/ip4/127.0.0.1/udp/0/quic-v1".into()],
        "tcp" => vec!["/ip4/127.0.0.1/tcp/0".into()],
        other => bail!("--transport: `{other}` is neither quic nor tcp"),
    })
}

pub(super) fn p2p_config(
    transport: &str,
    nodes: usize,
    floats: usize,
    lane: DataLane,
    k: usize,
) -> Result<P2pConfig> {
    Ok(P2pConfig::new(identity(), nodes, floats)
        .with_listen(listen_for(transport)?)
        .with_data_lane(lane)
        .with_lane_connections(k)
        .with_join_timeout(Duration::from_secs(60))
        .with_peer_timeout(Duration::from_secs(120)))
}

fn spawn_peer(spec: &str) -> Result<Child> {
    let exe = std::env::current_exe().context("locating our own executable")?;
    Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(PEER_ENV, spec)
        .spawn()
        .context("starting the benchmark peer process")
}

/// Bidirectional push-sum exchanges of `floats` floats; returns seconds for
/// `rounds` timed exchanges.
fn exchange(comm: &mut P2pComm, floats: usize, rounds: u64) -> Result<f64> {
    let mut x: Vec<f32> = (0..floats).map(|i| (i % 1000) as f32).collect();
    let mut w = 1.0;
    let other = [1 - comm.rank()];
    let mut start = Instant::now();
    for round in 0..=rounds {
        if round == 1 {
            start = Instant::now(); // round 0 warms the streams up
        }
        let r = PushSumRound {
            round,
            out_peers: &other,
            in_peers: &other,
            staleness: 0,
        };
        comm.push_sum(&r, &mut x, &mut w)?;
    }
    comm.barrier()?;
    Ok(start.elapsed().as_secs_f64())
}

/// Plain TCP: both ends write and read `bytes` per round at once.
fn plain_exchange(stream: TcpStream, bytes: usize, rounds: u64) -> Result<f64> {
    stream.set_nodelay(true)?;
    let mut reader = stream.try_clone()?;
    let mut writer = stream;
    let out = vec![7u8; bytes];
    let mut buf = vec![0u8; bytes];
    let mut start = Instant::now();
    for round in 0..=rounds {
        if round == 1 {
            start = Instant::now();
        }
        std::thread::scope(|s| -> Result<()> {
            let w = s.spawn(|| writer.write_all(&out));
            reader.read_exact(&mut buf)?;
            w.join()
                .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
            Ok(())
        })?;
    }
    Ok(start.elapsed().as_secs_f64())
}

pub(super) fn gbits(bytes: f64, secs: f64) -> f64 {
    bytes * 8.0 / secs / 1e9
}

/// A link kind of `bench transport`: its control transport and data lane.
fn link_kind(link: &str) -> Option<(&'static str, DataLane)> {
    Some(match link {
        "lane" => ("tcp", DataLane::Encrypted),
        "lane-plaintext" => ("tcp", DataLane::Plaintext),
        "quic" => ("quic", DataLane::Libp2p),
        "tcp" => ("tcp", DataLane::Libp2p),
        _ => return None,
    })
}

/// One measured figure of `bench transport`.
#[derive(serde::Serialize)]
struct Figure {
    size_mib: usize,
    link: String,
    /// `bytes` (pure transport) or `push-sum`.
    mode: &'static str,
    gbit_s: f64,
    ratio_to_plain_tcp: Option<f64>,
}

/// Measures `link` between two processes: pure transport and/or push-sum.
fn measure_link(
    link: &str,
    mib: usize,
    rounds: u64,
    pure: bool,
    push: bool,
    k: usize,
) -> Result<(Option<f64>, Option<f64>)> {
    let (t, lane) = link_kind(link).expect("checked");
    let bytes = mib << 20;
    let floats = bytes / 4;
    let total = (bytes as u64 * rounds) as f64;
    let pure = pure && lane != DataLane::Libp2p;
    let pending = P2pComm::bind(p2p_config(t, 2, floats, lane, k)?)?;
    let boot = pending.listen_addrs().join(",");
    let spec = format!("p2p;{link};{floats};{rounds};{pure};{push};{k};{boot}");
    let mut child = spawn_peer(&spec)?;
    let mut comm = pending.join()?;
    let result = both_ends(&mut comm, bytes, rounds, pure, push);
    comm.shutdown();
    child.wait()?;
    let (p, s) = result?;
    Ok((
        p.map(|secs| gbits(total, secs)),
        s.map(|secs| gbits(total, secs)),
    ))
}

/// What both processes run: seconds of the pure exchange and of the
/// push-sum exchange.
fn both_ends(
    comm: &mut P2pComm,
    bytes: usize,
    rounds: u64,
    pure: bool,
    push: bool,
) -> Result<(Option<f64>, Option<f64>)> {
    let other = 1 - comm.rank();
    let mut p = None;
    if pure {
        comm.lane_probe(other, bytes, 1, bytes as u64)?;
        let until = bytes as u64 * (1 + rounds);
        p = Some(comm.lane_probe(other, bytes, rounds, until)?);
        comm.barrier()?;
    }
    let s = if push {
        Some(exchange(comm, bytes / 4, rounds)?)
    } else {
        None
    };
    Ok((p, s))
}

fn transport(
    sizes_mib: &[usize],
    rounds: u64,
    links: &[String],
    mode: &str,
    k: usize,
    json: bool,
) -> Result<()> {
    for l in links {
        if l != "plain" && link_kind(l).is_none() {
            bail!("--links: `{l}` is none of plain, lane, lane-plaintext, quic, tcp");
        }
    }
    let (pure, push) = match mode {
        "bytes" => (true, false),
        "push-sum" => (false, true),
        "both" => (true, true),
        other => bail!("--mode: `{other}` is none of bytes, push-sum, both"),
    };
    let mut figures = Vec::new();
    if !json {
        println!(
            "one link, two processes, both directions at once; Gbit/s per direction; \
             lane: {k} connections per direction"
        );
        println!(
            "{:>8} {:>16} {:>10} {:>10} {:>10}",
            "MiB", "link", "mode", "Gbit/s", "/plain"
        );
    }
    for &mib in sizes_mib {
        let bytes = mib << 20;
        let total = (bytes as u64 * rounds) as f64;
        let mut plain = None;
        let row = |figures: &mut Vec<Figure>,
                   plain: Option<f64>,
                   link: &str,
                   mode: &'static str,
                   g: f64| {
            let ratio = plain.map(|p: f64| g / p);
            if !json {
                let r = ratio.map_or("-".to_string(), |r| format!("{r:.2}"));
                println!("{mib:>8} {link:>16} {mode:>10} {g:>10.2} {r:>10}");
            }
            figures.push(Figure {
                size_mib: mib,
                link: link.to_string(),
                mode,
                gbit_s: g,
                ratio_to_plain_tcp: ratio,
            });
        };
        if links.iter().any(|l| l == "plain") {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            let mut child = spawn_peer(&format!("plain;{bytes};{rounds};{addr}"))?;
            let (stream, _) = listener.accept()?;
            let secs = plain_exchange(stream, bytes, rounds)?;
            child.wait()?;
            let g = gbits(total, secs);
            row(&mut figures, None, "plain-tcp", "bytes", g);
            plain = Some(g);
        }
        for link in links.iter().filter(|l| *l != "plain") {
            let (p, s) = measure_link(link, mib, rounds, pure, push, k)?;
            if let Some(g) = p {
                row(&mut figures, plain, link, "bytes", g);
            }
            if let Some(g) = s {
                row(&mut figures, plain, link, "push-sum", g);
            }
        }
    }
    if json {
        let doc = serde_json::json!({
            "bench": "transport",
            "rounds": rounds,
            "lane_connections": k,
            "unit": "Gbit/s per direction",
            "figures": figures,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}

/// The far end of `transport`.
fn run_peer(spec: &str) -> Result<()> {
    let parts: Vec<&str> = spec.split(';').collect();
    match parts.as_slice() {
        ["plain", bytes, rounds, addr] => {
            let stream = TcpStream::connect(addr)?;
            plain_exchange(stream, bytes.parse()?, rounds.parse()?)?;
        }
        ["p2p", link, floats, rounds, pure, push, k, boot] => {
            let floats: usize = floats.parse()?;
            let (t, lane) =
                link_kind(link).ok_or_else(|| anyhow::anyhow!("unknown link `{link}`"))?;
            let cfg = p2p_config(t, 2, floats, lane, k.parse()?)?
                .with_bootstrap(boot.split(',').map(String::from));
            let mut comm = P2pComm::start(cfg)?;
            let r = both_ends(
                &mut comm,
                4 * floats,
                rounds.parse()?,
                pure.parse()?,
                push.parse()?,
            );
            comm.shutdown();
            r?;
        }
        ["allreduce", rest @ ..] => crate::commands::bench_allreduce::run_peer(rest)?,
        _ => bail!("{PEER_ENV}=`{spec}` is not a benchmark peer spec"),
    }
    Ok(())
}
