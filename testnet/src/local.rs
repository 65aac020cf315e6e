//! `slowmo-testnet local`: N `slowmo node` processes on 127.0.0.1.
//!
//! The first node is the bootstrap peer of the others. Every node gets its
//! own folder (identity, metrics, summary, parameters, log); the merged run
//! configuration is written once as `run.toml` and handed to every node, so
//! they all resolve the same settings. Every process started here is stopped
//! again, also on Ctrl-C or when one node fails.

use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use slowmo_runspec::{ConfigArgs, NodeSummary, ResultRow, last_record, results_table};

/// Transport the local nodes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Quic,
    Tcp,
}

/// Arguments of `slowmo-testnet local`.
#[derive(Debug, clap::Args)]
pub struct LocalArgs {
    /// Number of node processes.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Folder for every node's files [default: a new folder under testnet-runs/].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The slowmo binary [default: $SLOWMO_BIN, else `slowmo` beside this program].
    #[arg(long)]
    pub slowmo_bin: Option<PathBuf>,
    /// Transport between the nodes.
    #[arg(long, value_enum, default_value_t = Transport::Quic)]
    pub transport: Transport,
    /// Compute threads per node.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds for all nodes to join.
    #[arg(long, default_value_t = 60)]
    pub join_timeout: u64,
    /// Seconds a peer may stay silent.
    #[arg(long, default_value_t = 60)]
    pub peer_timeout: u64,
    /// Extra flag passed to every node (repeatable), e.g. --node-arg=--mdns.
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
    /// Print no combined progress.
    #[arg(long)]
    pub quiet: bool,
    /// Use an --out folder that is not empty: the earlier run's files
    /// (run.toml, node-N folders) are removed first.
    #[arg(long)]
    pub force: bool,
    /// Seconds each node has to write its outputs after SIGTERM before it
    /// is killed.
    #[arg(long, default_value_t = 15)]
    pub stop_grace: u64,
    /// Serve each node's Prometheus metrics: node i at
    /// http://127.0.0.1:(PORT + i)/metrics.
    #[arg(long, value_name = "PORT")]
    pub metrics_base_port: Option<u16>,
    /// Write no report.html at the end.
    #[arg(long)]
    pub no_report: bool,
}

/// Finds the slowmo binary.
pub fn slowmo_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_owned(),
        None => match std::env::var_os("SLOWMO_BIN") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .context("locating this program")?
                .with_file_name(format!("slowmo{}", std::env::consts::EXE_SUFFIX)),
        },
    };
    if !path.is_file() {
        bail!(
            "slowmo binary not found at {} (build it with `cargo build -p slowmo-node`, or pass --slowmo-bin / set SLOWMO_BIN)",
            path.display()
        );
    }
    Ok(path)
}

fn free_port(transport: Transport) -> anyhow::Result<u16> {
    Ok(match transport {
        Transport::Quic => UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port(),
        Transport::Tcp => TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
    })
}

fn multiaddr(transport: Transport, port: u16) -> String {
    match transport {
        Transport::Quic => format!("/ip4/127.0.0.1/udp/{port}/quic-v1"),
        Transport::Tcp => format!("/ip4/127.0.0.1/tcp/{port}"),
    }
}

/// Started node processes; dropping stops every one still running.
struct Nodes {
    list: Vec<(String, Child)>,
    /// How long the nodes have after SIGTERM.
    grace: Duration,
}

impl Nodes {
    /// Asks every running node to stop (SIGTERM), waits up to the grace
    /// period for all of them together, and kills the ones still running
    /// then. Returns the names of those it had to kill (each also reported).
    fn stop(&mut self) -> Vec<String> {
        let mut running = Vec::new();
        for (i, (_, child)) in self.list.iter_mut().enumerate() {
            if let Ok(None) = child.try_wait() {
                // SAFETY: plain kill(2) on a pid we started and have not reaped.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
                }
                running.push(i);
            }
        }
        let deadline = Instant::now() + self.grace;
        while !running.is_empty() && Instant::now() < deadline {
            running.retain(|&i| matches!(self.list[i].1.try_wait(), Ok(None)));
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut killed = Vec::new();
        for i in running {
            let (name, child) = &mut self.list[i];
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!(
                    "{name} did not stop within {} s of SIGTERM (--stop-grace); killed it",
                    self.grace.as_secs()
                );
                killed.push(name.clone());
            }
        }
        killed
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `; NAMES did not stop in time` for a message, or nothing.
fn not_stopped(killed: &[String]) -> String {
    if killed.is_empty() {
        String::new()
    } else {
        format!(
            "; {} did not stop in time and {} killed",
            killed.join(", "),
            if killed.len() == 1 { "was" } else { "were" }
        )
    }
}

fn last_step(metrics: &Path) -> Option<(u64, f32)> {
    let text = std::fs::read_to_string(metrics).ok()?;
    let r = last_record(&text)?;
    Some((r.step + 1, r.loss))
}

/// A new folder under testnet-runs/.
fn default_out() -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    PathBuf::from("testnet-runs").join(format!("local-{stamp}-{}", std::process::id()))
}

/// Runs a local testnet to the end and writes its report; errors name the
/// node that failed.
pub fn run(mut args: LocalArgs) -> anyhow::Result<()> {
    let out = args.out.get_or_insert_with(default_out).clone();
    let results = launch(&args)?;
    println!("{}", results_table(&results));
    if !args.no_report {
        let bin = slowmo_binary(args.slowmo_bin.as_deref())?;
        let path = crate::observe::write_report(&bin, &out)?;
        println!("report: {}", path.display());
    }
    Ok(())
}

/// Launches the nodes, waits for them, and returns their results.
pub fn launch(args: &LocalArgs) -> anyhow::Result<Vec<ResultRow>> {
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let mut options = args.config.options()?;
    options.workers = Some(args.nodes);
    let config = options.resolve().context("the run configuration")?;
    // Before anything starts: every node is a process holding a model and a
    // dataset.
    config.check_local_nodes(args.nodes, &slowmo_runspec::Resources::of_this_machine())?;
    let bin = slowmo_binary(args.slowmo_bin.as_deref())?;
    let out = args.out.clone().unwrap_or_else(default_out);
    let metrics_ports = args
        .metrics_base_port
        .map(|p| crate::observe::metrics_ports("--metrics-base-port", p, args.nodes))
        .transpose()?;
    crate::outdir::prepare(&out, args.force)?;
    let run_toml = out.join("run.toml");
    std::fs::write(&run_toml, options.to_toml()?)
        .with_context(|| format!("writing {}", run_toml.display()))?;

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler cannot be installed in tests that call launch twice; that is fine.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }

    let bootstrap_port = free_port(args.transport)?;
    let bootstrap = multiaddr(args.transport, bootstrap_port);
    let run_id = format!("local-{}", std::process::id());
    let mut nodes = Nodes {
        list: Vec::new(),
        grace: Duration::from_secs(args.stop_grace),
    };
    let mut dirs = Vec::new();
    for i in 0..args.nodes {
        let name = format!("node-{i}");
        let dir = out.join(&name);
        std::fs::create_dir_all(&dir)?;
        let _ = std::fs::remove_file(dir.join("summary.json"));
        let log = std::fs::File::create(dir.join("node.log"))?;
        let listen = if i == 0 {
            bootstrap.clone()
        } else {
            multiaddr(args.transport, 0)
        };
        let mut cmd = Command::new(&bin);
        cmd.arg("node")
            .arg("--config")
            .arg(&run_toml)
            .args(["--nodes", &args.nodes.to_string()])
            .args(["--run-id", &run_id])
            .args(["--listen", &listen])
            .args(["--threads", &args.threads.to_string()])
            .args(["--join-timeout", &args.join_timeout.to_string()])
            .args(["--peer-timeout", &args.peer_timeout.to_string()])
            .arg("--identity")
            .arg(dir.join("identity.key"))
            .arg("--metrics-jsonl")
            .arg(dir.join("metrics.jsonl"))
            .arg("--summary-json")
            .arg(dir.join("summary.json"))
            .arg("--save-params")
            .arg(dir.join("params.safetensors"))
            .args(&args.node_args)
            .stdin(Stdio::null())
            // Their own process group: a Ctrl-C at the terminal reaches this
            // harness alone, which then stops each node once.
            .process_group(0)
            .stdout(log.try_clone()?)
            .stderr(log);
        if i > 0 {
            cmd.args(["--bootstrap", &bootstrap]);
        }
        if let Some(ports) = &metrics_ports {
            cmd.args(["--metrics-addr", &format!("127.0.0.1:{}", ports[i])]);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", bin.display()))?;
        nodes.list.push((name, child));
        dirs.push(dir);
    }
    if !args.quiet {
        println!(
            "started {} nodes ({}), files in {}",
            args.nodes,
            config.algorithm.base,
            out.display()
        );
    }

    let mut exits = vec![None; args.nodes];
    let mut last_print = Instant::now();
    while exits.iter().any(Option::is_none) {
        if interrupted.load(Ordering::SeqCst) {
            let killed = nodes.stop();
            bail!(
                "interrupted: stopped every node{}; partial results in {}",
                not_stopped(&killed),
                out.display()
            );
        }
        for (i, (name, child)) in nodes.list.iter_mut().enumerate() {
            if exits[i].is_some() {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                exits[i] = Some(status);
                if !status.success() {
                    let log = dirs[i].join("node.log");
                    let tail = std::fs::read_to_string(&log)
                        .map(|t| {
                            let lines: Vec<&str> = t.lines().collect();
                            lines[lines.len().saturating_sub(15)..].join("\n")
                        })
                        .unwrap_or_default();
                    let name = name.clone();
                    let killed = nodes.stop();
                    bail!(
                        "{name} failed ({status}); stopped the others{}; its log {}:\n{tail}",
                        not_stopped(&killed),
                        log.display()
                    );
                }
            }
        }
        if !args.quiet && last_print.elapsed() >= Duration::from_secs(2) {
            last_print = Instant::now();
            let steps: Vec<String> = dirs
                .iter()
                .map(|d| match last_step(&d.join("metrics.jsonl")) {
                    Some((s, l)) => format!("{s}/{} ({l:.3})", config.steps),
                    None => "joining".into(),
                })
                .collect();
            println!("progress: {}", steps.join("  "));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(nodes);
    let results: Vec<ResultRow> = dirs
        .iter()
        .zip(&exits)
        .enumerate()
        .map(|(i, (d, status))| {
            let code = status.and_then(|s| s.code());
            ResultRow {
                node: format!("node-{i}"),
                state: if code.is_some() { "exited" } else { "killed" }.into(),
                exit_code: code.map(i64::from),
                limits: None,
                summary: std::fs::read_to_string(d.join("summary.json"))
                    .ok()
                    .and_then(|t| NodeSummary::from_json(&t).ok()),
            }
        })
        .collect();
    if let Some(bad) = results.iter().find(|r| !r.completed()) {
        bail!(
            "{} did not complete the run:\n{}",
            bad.node,
            results_table(&results)
        );
    }
    Ok(results)
}
