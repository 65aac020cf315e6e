//! `slowmo bench`: how fast the libp2p communicator moves tensors (the
//! simulator's benchmark is in [`crate::bench_sim`]).
//!
//! Figures are printed, never asserted. `transport` measures one link
//! between two processes (this one and a copy of itself, started with the
//! same command line and told its role through `SLOWMO_BENCH_PEER`, so the
//! child works however the command is wired into the CLI): push-sum shares
//! both ways over QUIC and over TCP + Noise + Yamux, against plain
//! unencrypted TCP sockets doing the same exchange. `allreduce` times the
//! exact average over real [`P2pComm`] nodes on threads of this process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use slowmo_gossip::p2p::{P2pComm, P2pConfig, RunIdentity};
use slowmo_gossip::{Communicator, PushSumRound};

/// Environment variable that turns a re-executed copy into the far end.
const PEER_ENV: &str = "SLOWMO_BENCH_PEER";

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
    /// Throughput of one link between two processes: QUIC, TCP+Noise+Yamux,
    /// and plain TCP for reference.
    Transport {
        /// Message sizes in MiB.
        #[arg(long, value_delimiter = ',', default_value = "4,64,256")]
        sizes_mib: Vec<usize>,
        /// Exchanges timed per size (after one warm-up).
        #[arg(long, default_value_t = 5)]
        rounds: u64,
        /// Which links to measure: any of plain, quic, tcp.
        #[arg(long, value_delimiter = ',', default_value = "plain,quic,tcp")]
        links: Vec<String>,
    },
    /// Time and bandwidth of the exact average over local nodes.
    Allreduce {
        /// Number of nodes (threads of this process, each a real libp2p node).
        #[arg(long, default_value_t = 4)]
        nodes: usize,
        /// Floats per node.
        #[arg(long, default_value_t = 10_000_000)]
        floats: usize,
        /// Timed all-reduces (after one warm-up).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Transport: quic or tcp.
        #[arg(long, default_value = "quic")]
        transport: String,
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
        } => crate::bench_sim::run(&workers, steps.max(1), &bases, model, repeats),
        BenchCommand::Transport {
            sizes_mib,
            rounds,
            links,
        } => transport(&sizes_mib, rounds.max(1), &links),
        BenchCommand::Allreduce {
            nodes,
            floats,
            repeats,
            transport,
        } => allreduce(nodes, floats, repeats.max(1), &transport),
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

fn p2p_config(transport: &str, nodes: usize, floats: usize) -> Result<P2pConfig> {
    Ok(P2pConfig::new(identity(), nodes, floats)
        .with_listen(listen_for(transport)?)
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

fn gbits(bytes: f64, secs: f64) -> f64 {
    bytes * 8.0 / secs / 1e9
}

fn transport(sizes_mib: &[usize], rounds: u64, links: &[String]) -> Result<()> {
    for l in links {
        if !["plain", "quic", "tcp"].contains(&l.as_str()) {
            bail!("--links: `{l}` is none of plain, quic, tcp");
        }
    }
    let has = |l: &str| links.iter().any(|x| x == l);
    println!("one link, two processes, both directions at once; Gbit/s per direction");
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "MiB", "plain tcp", "quic", "tcp+noise", "quic/plain", "noise/plain"
    );
    for &mib in sizes_mib {
        let bytes = mib << 20;
        let floats = bytes / 4;
        let total = (bytes as u64 * rounds) as f64;
        let mut rates = [f64::NAN; 3];
        if has("plain") {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            let mut child = spawn_peer(&format!("plain;{bytes};{rounds};{addr}"))?;
            let (stream, _) = listener.accept()?;
            let secs = plain_exchange(stream, bytes, rounds)?;
            child.wait()?;
            rates[0] = gbits(total, secs);
        }
        for (i, t) in [(1, "quic"), (2, "tcp")] {
            if !has(t) {
                continue;
            }
            let pending = P2pComm::bind(p2p_config(t, 2, floats)?)?;
            let boot = pending.listen_addrs().join(",");
            let mut child = spawn_peer(&format!("p2p;{t};{floats};{rounds};{boot}"))?;
            let mut comm = pending.join()?;
            let secs = exchange(&mut comm, floats, rounds)?;
            comm.shutdown();
            child.wait()?;
            rates[i] = gbits(total, secs);
        }
        println!(
            "{:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            mib,
            rates[0],
            rates[1],
            rates[2],
            rates[1] / rates[0],
            rates[2] / rates[0]
        );
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
        ["p2p", t, floats, rounds, boot] => {
            let floats: usize = floats.parse()?;
            let cfg = p2p_config(t, 2, floats)?.with_bootstrap(boot.split(',').map(String::from));
            let mut comm = P2pComm::start(cfg)?;
            exchange(&mut comm, floats, rounds.parse()?)?;
            comm.shutdown();
        }
        _ => bail!("{PEER_ENV}=`{spec}` is not a benchmark peer spec"),
    }
    Ok(())
}

fn allreduce(nodes: usize, floats: usize, repeats: usize, transport: &str) -> Result<()> {
    let first = P2pComm::bind(p2p_config(transport, nodes, floats)?)?;
    let boot = first.listen_addrs();
    let mut handles = vec![std::thread::spawn(move || first.join())];
    for _ in 1..nodes {
        let cfg = p2p_config(transport, nodes, floats)?.with_bootstrap(boot.clone());
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
    let workers: Vec<_> = comms
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || -> Result<(P2pComm, Vec<f64>)> {
                let mut buf: Vec<f32> = (0..floats).map(|i| (i % 100) as f32 * 0.01).collect();
                let mut times = Vec::new();
                for k in 0..=repeats {
                    let mut s = 1.0;
                    c.barrier()?;
                    let t = Instant::now();
                    c.all_reduce_sum(&mut buf, &mut s)?;
                    if k > 0 {
                        times.push(t.elapsed().as_secs_f64());
                    }
                    let inv = 1.0 / s as f32;
                    buf.iter_mut().for_each(|v| *v *= inv);
                }
                Ok((c, times))
            })
        })
        .collect();
    let mut per_rank = Vec::new();
    for h in workers {
        let (c, times) = h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
        per_rank.push(times);
        c.shutdown();
    }
    let bytes = 4.0 * floats as f64;
    println!(
        "all-reduce of {floats} floats ({:.1} MiB) over {nodes} nodes ({transport}, threads of one process)",
        bytes / (1 << 20) as f64
    );
    println!(
        "{:>6} {:>10} {:>14} {:>14}",
        "repeat", "seconds", "algo Gbit/s", "bus Gbit/s"
    );
    for k in 0..repeats {
        let secs = per_rank.iter().map(|t| t[k]).fold(0.0, f64::max);
        let bus = bytes * 2.0 * (nodes as f64 - 1.0) / nodes as f64;
        println!(
            "{:>6} {:>10.3} {:>14.2} {:>14.2}",
            k + 1,
            secs,
            gbits(bytes, secs),
            gbits(bus, secs)
        );
    }
    Ok(())
}
