//! `slowmo-testnet local`: N `slowmo node` processes on 127.0.0.1.
//!
//! The first node is the bootstrap peer of the others. Every node gets its
//! own folder (identity, metrics, summary, parameters, log, checkpoints); the
//! merged run configuration is written once as `run.toml` and handed to every
//! node, so they all resolve the same settings.
//!
//! A node that exits, fails or is killed does not stop the others: its end
//! (exit status or signal, time) is recorded and the run goes on until every
//! node still running has exited. `--faults` scripts kills, restarts, pauses
//! and resumes, and new nodes joining mid-run (see [`crate::faults`]); a
//! restarted node runs the same command with the same identity, its log is
//! appended to and its earlier metrics and summary are kept as
//! `metrics.K.jsonl` and `summary.K.json` (K = 1 for its first life). A
//! joining node (`join 4@300` in a run of 4) gets a new identity in its own
//! folder `node-4`, the others' command, and the live nodes as its bootstrap
//! peers. Every process started here is stopped again on Ctrl-C.
//!
//! Besides the nodes' folders the run folder holds `testnet.json` (run id,
//! nodes, transport: what `--resume` needs), `events.jsonl` (every start,
//! exit and scripted fault, with its time), `fates.json` and `results.md`
//! (per node: finished, failed, killed, restarted) and `results.json`.

use std::ffi::OsString;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use slowmo_runspec::{ConfigArgs, NodeSummary, ResultRow, last_record, results_table};

use crate::chaos::LogEntry;
use crate::faults::{FaultAction, ScriptedFault, Trigger};

/// Transport the local nodes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Quic,
    Tcp,
}

/// Arguments of `slowmo-testnet local`.
#[derive(Debug, Clone, clap::Args)]
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
    /// Scripted faults, e.g. `kill 2@5s; restart 2@12s; pause 1@40; resume
    /// 1@60; join 4@300` (`@Ns`: seconds after the start; `@N`: when the run
    /// reaches step N; `join I` with I >= --nodes starts a new node mid-run),
    /// or a file holding such lines.
    #[arg(long, value_name = "SCRIPT")]
    pub faults: Option<String>,
    /// Passed to every node: the fewest members the run trains with.
    #[arg(long)]
    pub min_nodes: Option<usize>,
    /// Every node writes checkpoints into node-N/checkpoints (implied by the
    /// other checkpoint flags).
    #[arg(long)]
    pub checkpoints: bool,
    /// Outer iterations between checkpoints [node default: 1].
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,
    /// Checkpoints each node keeps [node default: 3].
    #[arg(long, value_name = "K")]
    pub checkpoint_keep: Option<u64>,
    /// Continue the earlier run in --out from its checkpoints: same run id,
    /// identities and folders; logs are appended to, earlier metrics kept as
    /// metrics.K.jsonl.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
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

/// Seconds since the Unix epoch.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the run folder records about the run itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestnetRecord {
    pub run_id: String,
    pub nodes: usize,
    pub transport: String,
}

/// How one node fared over the run, all its lives together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFate {
    pub node: String,
    /// `finished` (its last life exited 0 with a completed summary),
    /// `killed` (by a scripted fault, not restarted), `failed` (it exited
    /// otherwise on its own), `stopped` (by the harness: Ctrl-C), `not
    /// started` (a scripted `join` that never came: the run ended first).
    pub fate: String,
    /// Processes started for it (1 + restarts).
    pub lives: u32,
    pub kills: u32,
    pub restarts: u32,
    pub pauses: u32,
    /// How its last life ended: `exit status: 1`, `signal: 9 (SIGKILL)`.
    pub exit: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Seconds after the start at which its last life ended.
    pub ended_at_s: Option<f64>,
    /// Who ended its last life: `self` (it exited or died on its own),
    /// `fault` (a scripted kill) or `harness` (stopped on Ctrl-C).
    pub ended_by: Option<String>,
    pub completed: bool,
}

impl NodeFate {
    /// One cell: `finished`, `killed at 5.0 s`, `finished after 1 restart`...
    pub fn describe(&self) -> String {
        let at = self
            .ended_at_s
            .map(|t| format!(" at {t:.1} s"))
            .unwrap_or_default();
        let mut text = match self.fate.as_str() {
            "finished" => "finished".to_string(),
            "killed" => format!("killed{at}"),
            "failed" => format!(
                "failed{at} ({}{})",
                self.exit.as_deref().unwrap_or("no exit status"),
                if self.exit_code == Some(0) {
                    ", no completed summary"
                } else {
                    ""
                }
            ),
            other => format!("{other}{at}"),
        };
        if self.restarts > 0 {
            text.push_str(&format!(
                ", after {} restart{}",
                self.restarts,
                if self.restarts == 1 { "" } else { "s" }
            ));
        }
        text
    }
}

/// The per-node fates as a markdown table.
pub fn fates_table(fates: &[NodeFate]) -> String {
    let mut out = String::from(
        "| node | fate | exit | ended at s | ended by | lives | kills | restarts | pauses |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for f in fates {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            f.node,
            f.describe(),
            f.exit.as_deref().unwrap_or("-"),
            f.ended_at_s.map_or("-".into(), |t| format!("{t:.1}")),
            f.ended_by.as_deref().unwrap_or("-"),
            f.lives,
            f.kills,
            f.restarts,
            f.pauses
        ));
    }
    out
}

/// One node over its lives.
struct Slot {
    name: String,
    dir: PathBuf,
    /// The node's arguments (after the binary), the same for every life.
    args: Vec<OsString>,
    /// A node that joins mid-run: its bootstrap peers are added to `args`
    /// when it first starts (the live nodes then).
    joiner: bool,
    child: Option<Child>,
    paused: bool,
    /// The current life was ended by a scripted kill / by the harness.
    ended_by: Option<&'static str>,
    fate: NodeFate,
}

impl Slot {
    fn running(&self) -> bool {
        self.child.is_some()
    }
}

/// Started node processes; dropping stops every one still running.
struct Nodes {
    slots: Vec<Slot>,
    /// How long the nodes have after SIGTERM.
    grace: Duration,
    start: Instant,
    events: std::fs::File,
    events_path: PathBuf,
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a pid we started and have not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

impl Nodes {
    fn elapsed(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
    }

    /// Appends one line to events.jsonl (errors are reported, not fatal:
    /// the run matters more than its log).
    fn event(&mut self, action: &str, target: &str, result: &str) {
        let entry = LogEntry {
            t: self.elapsed(),
            unix: unix_now(),
            action: action.to_string(),
            target: target.to_string(),
            result: result.to_string(),
        };
        let line = serde_json::to_string(&entry).unwrap_or_default();
        if let Err(e) = writeln!(self.events, "{line}") {
            eprintln!("writing {}: {e}", self.events_path.display());
        }
    }

    /// Records the end of node `i`'s current life.
    fn ended(&mut self, i: usize, status: ExitStatus) {
        let t = self.elapsed();
        let slot = &mut self.slots[i];
        slot.child = None;
        slot.paused = false;
        let by = slot.ended_by.take().unwrap_or("self");
        let f = &mut slot.fate;
        f.exit = Some(status.to_string());
        f.exit_code = status.code();
        f.signal = status.signal();
        f.ended_at_s = Some(t);
        f.ended_by = Some(by.to_string());
        let name = slot.name.clone();
        self.event("exit", &name, &format!("{status} (by {by})"));
    }

    /// Reaps every node that has exited; returns their indices.
    fn reap(&mut self) -> anyhow::Result<Vec<usize>> {
        let mut done = Vec::new();
        for i in 0..self.slots.len() {
            let Some(child) = self.slots[i].child.as_mut() else {
                continue;
            };
            if let Some(status) = child.try_wait()? {
                self.ended(i, status);
                done.push(i);
            }
        }
        Ok(done)
    }

    /// Starts (or restarts) node `i`: appends to its log with a marker line
    /// after the first life.
    fn spawn(&mut self, i: usize, bin: &Path, note: &str) -> anyhow::Result<()> {
        let t = self.elapsed();
        let slot = &mut self.slots[i];
        let log_path = slot.dir.join("node.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        if !note.is_empty() {
            writeln!(log, "--- slowmo-testnet: {note} at {t:.1} s ---")?;
        }
        let child = Command::new(bin)
            .args(&slot.args)
            .stdin(Stdio::null())
            // Their own process group: a Ctrl-C at the terminal reaches this
            // harness alone, which then stops each node once.
            .process_group(0)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} ({})", slot.name, bin.display()))?;
        slot.child = Some(child);
        slot.paused = false;
        slot.fate.lives += 1;
        slot.fate.ended_at_s = None;
        slot.fate.ended_by = None;
        slot.fate.exit = None;
        slot.fate.exit_code = None;
        slot.fate.signal = None;
        let name = slot.name.clone();
        self.event(
            "start",
            &name,
            if note.is_empty() { "started" } else { note },
        );
        Ok(())
    }

    /// Where the running nodes listen, as their logs name it
    /// (`listening on ADDR/p2p/PEER`), node 0's known address first.
    fn live_addresses(&self, first: &str) -> Vec<String> {
        let mut out = vec![first.to_string()];
        for slot in self.slots.iter().filter(|s| s.running() && !s.paused) {
            let Ok(log) = std::fs::read_to_string(slot.dir.join("node.log")) else {
                continue;
            };
            for line in log.lines() {
                if let Some((_, rest)) = line.split_once("listening on ") {
                    let addr: String = rest
                        .chars()
                        .take_while(|c| !c.is_whitespace() && *c != '\u{1b}')
                        .collect();
                    if addr.starts_with('/') && !out.contains(&addr) {
                        out.push(addr);
                    }
                }
            }
        }
        out
    }

    /// Carries out one scripted fault; returns what goes to the log.
    fn fault(&mut self, f: &ScriptedFault, bin: &Path, bootstrap: &str) -> anyhow::Result<String> {
        let i = f.node;
        let name = self.slots[i].name.clone();
        let result = match f.action {
            FaultAction::Join => {
                if self.slots[i].fate.lives > 0 {
                    "skipped: already started".to_string()
                } else {
                    let peers = self.live_addresses(bootstrap);
                    let slot = &mut self.slots[i];
                    for addr in &peers {
                        slot.args.push("--bootstrap".into());
                        slot.args.push(addr.into());
                    }
                    let step = match f.at {
                        Trigger::Step(s) => format!(" (the run at step {s})"),
                        Trigger::Seconds(_) => String::new(),
                    };
                    self.spawn(i, bin, &format!("{name} joins the run{step}"))?;
                    format!("done ({} bootstrap peers)", peers.len())
                }
            }
            FaultAction::Kill => match self.slots[i].child.as_mut() {
                None => "skipped: not running".to_string(),
                Some(child) => {
                    let _ = child.kill();
                    let status = child.wait()?;
                    self.slots[i].ended_by = Some("fault");
                    self.slots[i].fate.kills += 1;
                    self.ended(i, status);
                    "done".to_string()
                }
            },
            FaultAction::Restart => {
                if self.slots[i].running() {
                    "skipped: running".to_string()
                } else {
                    keep_earlier_life(&self.slots[i].dir)?;
                    self.slots[i].fate.restarts += 1;
                    let life = self.slots[i].fate.lives + 1;
                    self.spawn(i, bin, &format!("{name} restarted (life {life})"))?;
                    "done".to_string()
                }
            }
            FaultAction::Pause | FaultAction::Resume => {
                let pause = f.action == FaultAction::Pause;
                let slot = &mut self.slots[i];
                match &slot.child {
                    None => "skipped: not running".to_string(),
                    Some(_) if slot.paused == pause => format!(
                        "skipped: already {}",
                        if pause { "paused" } else { "running" }
                    ),
                    Some(child) => {
                        signal(
                            child.id(),
                            if pause { libc::SIGSTOP } else { libc::SIGCONT },
                        );
                        slot.paused = pause;
                        if pause {
                            slot.fate.pauses += 1;
                        }
                        "done".to_string()
                    }
                }
            }
        };
        self.event(f.action.name(), &name, &result);
        Ok(result)
    }

    /// Asks every running node to stop (SIGTERM; a paused one is resumed
    /// first), waits up to the grace period for all of them together, and
    /// kills the ones still running then. Returns the names of those it had
    /// to kill (each also reported).
    fn stop(&mut self) -> Vec<String> {
        let mut running = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(child) = &slot.child {
                signal(child.id(), libc::SIGTERM);
                if slot.paused {
                    signal(child.id(), libc::SIGCONT);
                }
                slot.ended_by = Some("harness");
                running.push(i);
            }
        }
        let deadline = Instant::now() + self.grace;
        while !running.is_empty() && Instant::now() < deadline {
            let _ = self.reap();
            running.retain(|&i| self.slots[i].running());
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut killed = Vec::new();
        for i in running {
            if let Some(child) = self.slots[i].child.as_mut() {
                let _ = child.kill();
                if let Ok(status) = child.wait() {
                    self.ended(i, status);
                }
                let name = self.slots[i].name.clone();
                eprintln!(
                    "{name} did not stop within {} s of SIGTERM (--stop-grace); killed it",
                    self.grace.as_secs()
                );
                killed.push(name);
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

/// Keeps an ended life's metrics and summary as `metrics.K.jsonl` and
/// `summary.K.json` (K: the first number not taken), so that a new life of
/// the node, which writes its files afresh, destroys nothing.
fn keep_earlier_life(dir: &Path) -> anyhow::Result<()> {
    let mut k = 1;
    while dir.join(format!("metrics.{k}.jsonl")).exists()
        || dir.join(format!("summary.{k}.json")).exists()
    {
        k += 1;
    }
    for (name, kept) in [
        ("metrics.jsonl", format!("metrics.{k}.jsonl")),
        ("summary.json", format!("summary.{k}.json")),
    ] {
        let from = dir.join(name);
        if from.exists() {
            let to = dir.join(kept);
            std::fs::rename(&from, &to)
                .with_context(|| format!("renaming {} to {}", from.display(), to.display()))?;
        }
    }
    Ok(())
}

/// The last step record of a metrics file, reading only its tail: `(steps
/// done, loss)`.
fn last_step(metrics: &Path) -> Option<(u64, f32)> {
    let mut file = std::fs::File::open(metrics).ok()?;
    let len = file.metadata().ok()?.len();
    const TAIL: u64 = 16 * 1024;
    let from = len.saturating_sub(TAIL);
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    // Past the first (possibly cut) line when the tail starts mid-file.
    let text = if from > 0 {
        text.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        &text
    };
    let r = last_record(text)?;
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

/// What a local run gives back.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub rows: Vec<ResultRow>,
    pub fates: Vec<NodeFate>,
    /// Why the run failed, naming the nodes; `None` when every node
    /// finished or was killed by the script (and one at least finished).
    pub failure: Option<String>,
}

/// Runs a local testnet to the end and writes its report; errors name the
/// nodes that failed.
pub fn run(mut args: LocalArgs) -> anyhow::Result<()> {
    let out = args.out.get_or_insert_with(default_out).clone();
    let outcome = run_nodes(&args)?;
    println!("{}", results_table(&outcome.rows));
    println!("{}", fates_table(&outcome.fates));
    if !args.no_report {
        let report = slowmo_binary(args.slowmo_bin.as_deref())
            .and_then(|bin| crate::observe::write_report(&bin, &out));
        match (report, &outcome.failure) {
            (Ok(path), _) => println!("report: {}", path.display()),
            (Err(e), None) => return Err(e),
            (Err(e), Some(_)) => eprintln!("no report written: {e:#}"),
        }
    }
    match outcome.failure {
        Some(why) => bail!("{why}; files in {}", out.display()),
        None => Ok(()),
    }
}

/// Launches the nodes, waits for them, and returns their results; fails
/// when a node did not finish (see [`Outcome::failure`]).
pub fn launch(args: &LocalArgs) -> anyhow::Result<Vec<ResultRow>> {
    let outcome = run_nodes(args)?;
    match outcome.failure {
        Some(why) => bail!("{why}:\n{}", results_table(&outcome.rows)),
        None => Ok(outcome.rows),
    }
}

/// The fault script: the text itself, or the file it names.
fn fault_script(args: &LocalArgs) -> anyhow::Result<Vec<ScriptedFault>> {
    let Some(text) = &args.faults else {
        return Ok(Vec::new());
    };
    let path = Path::new(text);
    let text = if !text.contains('@') && path.is_file() {
        std::fs::read_to_string(path)
            .with_context(|| format!("--faults: reading {}", path.display()))?
    } else {
        text.clone()
    };
    crate::faults::parse_script(&text, args.nodes).map_err(|e| anyhow::anyhow!(e))
}

/// Launches the nodes, carries out the fault script, waits until every
/// node has exited, and returns what became of each.
pub fn run_nodes(args: &LocalArgs) -> anyhow::Result<Outcome> {
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let script = fault_script(args)?;
    let mut options = args.config.options()?;
    options.workers = Some(args.nodes);
    let config = options.resolve().context("the run configuration")?;
    // Before anything starts: every node is a process holding a model and a
    // dataset.
    // Nodes the script adds mid-run come after the first ones.
    let joins = script
        .iter()
        .filter(|f| f.action == FaultAction::Join)
        .count();
    let slots = args.nodes + joins;
    config.check_local_nodes(slots, &slowmo_runspec::Resources::of_this_machine())?;
    let bin = slowmo_binary(args.slowmo_bin.as_deref())?;
    if let Some(m) = args.min_nodes
        && (m == 0 || m > args.nodes)
    {
        bail!(
            "--min-nodes {m}: must be between 1 and --nodes {}",
            args.nodes
        );
    }
    let out = args.out.clone().unwrap_or_else(default_out);
    let metrics_ports = args
        .metrics_base_port
        .map(|p| crate::observe::metrics_ports("--metrics-base-port", p, slots))
        .transpose()?;
    let run_toml = out.join("run.toml");
    let toml_text = options.to_toml()?;
    let record_path = out.join("testnet.json");
    let record = if args.resume {
        let text = std::fs::read_to_string(&record_path).with_context(|| {
            format!(
                "--resume: no earlier run in --out {} ({} is missing)",
                out.display(),
                record_path.display()
            )
        })?;
        let record: TestnetRecord = serde_json::from_str(&text)
            .with_context(|| format!("--resume: {} is not readable", record_path.display()))?;
        if record.nodes != args.nodes {
            bail!(
                "--resume: the earlier run in {} had {} nodes, --nodes is {}",
                out.display(),
                record.nodes,
                args.nodes
            );
        }
        let earlier = std::fs::read_to_string(&run_toml).unwrap_or_default();
        if earlier != toml_text {
            bail!(
                "--resume: the run configuration differs from the earlier run's {} (its \
                 checkpoints would be refused); give the same settings",
                run_toml.display()
            );
        }
        record
    } else {
        crate::outdir::prepare(&out, args.force)?;
        let record = TestnetRecord {
            run_id: format!("local-{}", std::process::id()),
            nodes: args.nodes,
            transport: format!("{:?}", args.transport).to_lowercase(),
        };
        std::fs::write(&record_path, serde_json::to_string_pretty(&record)?)
            .with_context(|| format!("writing {}", record_path.display()))?;
        std::fs::write(&run_toml, &toml_text)
            .with_context(|| format!("writing {}", run_toml.display()))?;
        record
    };
    let checkpoints = args.checkpoints
        || args.resume
        || args.checkpoint_every.is_some()
        || args.checkpoint_keep.is_some();

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler cannot be installed in tests that call launch twice; that is fine.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }

    let bootstrap_port = free_port(args.transport)?;
    let bootstrap = multiaddr(args.transport, bootstrap_port);
    let events_path = out.join("events.jsonl");
    let events = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&events_path)
        .with_context(|| format!("opening {}", events_path.display()))?;
    let mut nodes = Nodes {
        slots: Vec::new(),
        grace: Duration::from_secs(args.stop_grace),
        start: Instant::now(),
        events,
        events_path,
    };
    for i in 0..slots {
        let joiner = i >= args.nodes;
        let name = format!("node-{i}");
        let dir = out.join(&name);
        std::fs::create_dir_all(&dir)?;
        if joiner {
            // A new node: a new identity, nothing from an earlier run.
            for stale in [
                "identity.key",
                "summary.json",
                "metrics.jsonl",
                "params.safetensors",
            ] {
                let _ = std::fs::remove_file(dir.join(stale));
            }
            std::fs::File::create(dir.join("node.log"))?;
        } else if args.resume {
            keep_earlier_life(&dir)?;
        } else {
            let _ = std::fs::remove_file(dir.join("summary.json"));
            std::fs::File::create(dir.join("node.log"))?;
        }
        let listen = if i == 0 {
            bootstrap.clone()
        } else {
            multiaddr(args.transport, 0)
        };
        let mut a: Vec<OsString> = vec!["node".into()];
        let mut flag = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
            a.push(k.into());
            a.push(v.as_ref().to_owned());
        };
        flag("--config", &run_toml);
        flag("--nodes", &args.nodes.to_string());
        flag("--run-id", &record.run_id);
        flag("--listen", &listen);
        flag("--threads", &args.threads.to_string());
        flag("--join-timeout", &args.join_timeout.to_string());
        flag("--peer-timeout", &args.peer_timeout.to_string());
        flag("--identity", &dir.join("identity.key"));
        flag("--metrics-jsonl", &dir.join("metrics.jsonl"));
        flag("--summary-json", &dir.join("summary.json"));
        flag("--save-params", &dir.join("params.safetensors"));
        if i > 0 && !joiner {
            flag("--bootstrap", &bootstrap);
        }
        if let Some(ports) = &metrics_ports {
            flag("--metrics-addr", &format!("127.0.0.1:{}", ports[i]));
        }
        if let Some(m) = args.min_nodes {
            flag("--min-nodes", &m.to_string());
        }
        if checkpoints {
            flag("--checkpoint-dir", &dir.join("checkpoints"));
            if let Some(n) = args.checkpoint_every {
                flag("--checkpoint-every", &n.to_string());
            }
            if let Some(k) = args.checkpoint_keep {
                flag("--checkpoint-keep", &k.to_string());
            }
        }
        if args.resume {
            a.push("--resume".into());
        }
        a.extend(args.node_args.iter().map(OsString::from));
        nodes.slots.push(Slot {
            fate: NodeFate {
                node: name.clone(),
                ..NodeFate::default()
            },
            name,
            dir,
            args: a,
            joiner,
            child: None,
            paused: false,
            ended_by: None,
        });
    }
    for i in 0..args.nodes {
        let note = if args.resume {
            "resumed from its checkpoints"
        } else {
            ""
        };
        nodes.spawn(i, &bin, note)?;
    }
    if !args.quiet {
        println!(
            "started {} nodes ({}), files in {}",
            args.nodes,
            config.algorithm.base,
            out.display()
        );
    }

    // Faults not yet carried out; a fault waits for the earlier ones on its node.
    let mut pending: Vec<ScriptedFault> = script;
    let mut last_print = Instant::now();
    let mut run_step = 0u64;
    loop {
        if interrupted.load(Ordering::SeqCst) {
            let killed = nodes.stop();
            nodes.event("stop", "all", "interrupted");
            let outcome = finish(&mut nodes);
            write_results(&out, &outcome)?;
            bail!(
                "interrupted: stopped every node{}; partial results in {}",
                not_stopped(&killed),
                out.display()
            );
        }
        for i in nodes.reap()? {
            let f = &nodes.slots[i].fate;
            let by = f.ended_by.as_deref().unwrap_or("self");
            if f.exit_code != Some(0) && by == "self" {
                let log = nodes.slots[i].dir.join("node.log");
                let tail = std::fs::read_to_string(&log)
                    .map(|t| {
                        let lines: Vec<&str> = t.lines().collect();
                        lines[lines.len().saturating_sub(5)..].join("\n")
                    })
                    .unwrap_or_default();
                eprintln!(
                    "{} failed ({}) at {:.1} s; the others go on; its log {}:\n{tail}",
                    nodes.slots[i].name,
                    f.exit.as_deref().unwrap_or("?"),
                    f.ended_at_s.unwrap_or(0.0),
                    log.display()
                );
            }
        }
        // The run's step, for step triggers (the metrics files' tails).
        if pending.iter().any(|f| matches!(f.at, Trigger::Step(_))) {
            for slot in nodes.slots.iter().filter(|s| s.running()) {
                if let Some((s, _)) = last_step(&slot.dir.join("metrics.jsonl")) {
                    run_step = run_step.max(s);
                }
            }
        }
        let now = nodes.start.elapsed().as_secs_f64();
        let mut k = 0;
        while k < pending.len() {
            let f = &pending[k];
            let first_on_node = !pending[..k].iter().any(|e| e.node == f.node);
            let due = match f.at {
                Trigger::Seconds(s) => now >= s,
                Trigger::Step(s) => run_step >= s,
            };
            if first_on_node && due {
                let f = pending.remove(k);
                let result = nodes.fault(&f, &bin, &bootstrap)?;
                if !args.quiet {
                    println!("fault {f}: {result}");
                }
            } else {
                k += 1;
            }
        }
        let running = nodes.slots.iter().filter(|s| s.running()).count();
        if running == 0 {
            // Nothing moves steps any more; a timed restart may still come.
            // (One that waits for a fault still to come on its node never fires.)
            let timed_restart = pending.iter().enumerate().any(|(k, f)| {
                matches!(f.action, FaultAction::Restart | FaultAction::Join)
                    && matches!(f.at, Trigger::Seconds(_))
                    && !pending[..k].iter().any(|e| e.node == f.node)
            });
            if !timed_restart {
                for f in pending.drain(..) {
                    nodes.event(
                        f.action.name(),
                        &format!("node-{}", f.node),
                        "not done: every node had exited",
                    );
                }
                break;
            }
        } else if nodes.slots.iter().filter(|s| s.running()).all(|s| s.paused)
            && !pending.iter().any(|f| f.action == FaultAction::Resume)
        {
            // Every running node frozen and no resume to come: the run
            // would never end.
            for i in 0..nodes.slots.len() {
                if nodes.slots[i].paused {
                    let f = ScriptedFault {
                        action: FaultAction::Resume,
                        node: i,
                        at: Trigger::Seconds(now),
                    };
                    nodes.fault(&f, &bin, &bootstrap)?;
                }
            }
        }
        if !args.quiet && last_print.elapsed() >= Duration::from_secs(2) {
            last_print = Instant::now();
            let steps: Vec<String> = nodes
                .slots
                .iter()
                .map(|s| {
                    let state = match (s.running(), s.paused) {
                        (true, true) => " paused",
                        (true, false) => "",
                        (false, _) if s.fate.ended_by.as_deref() == Some("self") => " exited",
                        (false, _) => " down",
                    };
                    match last_step(&s.dir.join("metrics.jsonl")) {
                        _ if s.joiner && s.fate.lives == 0 => "to join".into(),
                        Some((n, l)) => format!("{n}/{} ({l:.3}){state}", config.steps),
                        None if s.running() => format!("joining{state}"),
                        None => "down".into(),
                    }
                })
                .collect();
            println!("progress: {}", steps.join("  "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let outcome = finish(&mut nodes);
    drop(nodes);
    write_results(&out, &outcome)?;
    Ok(outcome)
}

/// The rows, fates and verdict once every node has exited.
fn finish(nodes: &mut Nodes) -> Outcome {
    let mut rows = Vec::new();
    let mut fates = Vec::new();
    for slot in &mut nodes.slots {
        let summary = std::fs::read_to_string(slot.dir.join("summary.json"))
            .ok()
            .and_then(|t| NodeSummary::from_json(&t).ok());
        let f = &mut slot.fate;
        f.completed = f.exit_code == Some(0) && summary.as_ref().is_some_and(|s| s.completed);
        f.fate = match f.ended_by.as_deref() {
            _ if f.completed => "finished",
            _ if f.lives == 0 => "not started",
            Some("fault") => "killed",
            Some("harness") => "stopped",
            _ => "failed",
        }
        .to_string();
        rows.push(ResultRow {
            node: slot.name.clone(),
            state: match (f.fate.as_str(), f.exit_code, f.signal) {
                ("killed", _, _) => "killed".to_string(),
                ("not started", _, _) => "not started".to_string(),
                (_, Some(_), _) => "exited".to_string(),
                (_, None, Some(sig)) => format!("signal {sig}"),
                _ => "unknown".to_string(),
            },
            exit_code: f.exit_code.map(i64::from),
            limits: None,
            summary,
        });
        fates.push(f.clone());
    }
    let bad: Vec<String> = fates
        .iter()
        .filter(|f| f.fate != "finished" && f.fate != "killed" && f.fate != "not started")
        .map(|f| format!("{} {}", f.node, f.describe()))
        .collect();
    let failure = if !bad.is_empty() {
        Some(format!(
            "not every node completed the run: {}",
            bad.join("; ")
        ))
    } else if !fates.iter().any(|f| f.fate == "finished") {
        Some("no node completed the run".to_string())
    } else {
        None
    };
    Outcome {
        rows,
        fates,
        failure,
    }
}

/// results.md (both tables), results.json (the rows) and fates.json.
fn write_results(out: &Path, outcome: &Outcome) -> anyhow::Result<()> {
    let md = format!(
        "{}\n{}",
        results_table(&outcome.rows),
        fates_table(&outcome.fates)
    );
    for (name, text) in [
        ("results.md", md),
        ("results.json", serde_json::to_string_pretty(&outcome.rows)?),
        ("fates.json", serde_json::to_string_pretty(&outcome.fates)?),
    ] {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_life_is_kept_under_the_next_free_number() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("metrics.jsonl"), "life 1\n").unwrap();
        keep_earlier_life(d).unwrap();
        std::fs::write(d.join("metrics.jsonl"), "life 2\n").unwrap();
        std::fs::write(d.join("summary.json"), "{}").unwrap();
        keep_earlier_life(d).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join("metrics.1.jsonl")).unwrap(),
            "life 1\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.join("metrics.2.jsonl")).unwrap(),
            "life 2\n"
        );
        assert!(d.join("summary.2.json").exists());
        assert!(!d.join("metrics.jsonl").exists());
        // Nothing to keep is fine.
        keep_earlier_life(d).unwrap();
    }

    #[test]
    fn the_last_step_comes_from_the_tail_of_a_long_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut text = String::new();
        for step in 0..2000 {
            text.push_str(&format!(
                "{{\"step\":{step},\"time\":0.1,\"loss\":0.5,\"lr\":0.1,\"bytes_sent\":0,\
                 \"bytes_received\":0,\"weight\":1.0,\"gossip_rounds\":0}}\n"
            ));
        }
        std::fs::write(&path, &text).unwrap();
        assert!(text.len() > 16 * 1024);
        assert_eq!(last_step(&path), Some((2000, 0.5)));
    }

    #[test]
    fn fates_describe_how_a_node_ended() {
        let f = NodeFate {
            node: "node-2".into(),
            fate: "killed".into(),
            ended_at_s: Some(5.04),
            ..NodeFate::default()
        };
        assert_eq!(f.describe(), "killed at 5.0 s");
        let f = NodeFate {
            fate: "finished".into(),
            restarts: 1,
            ..f
        };
        assert_eq!(f.describe(), "finished, after 1 restart");
        let table = fates_table(&[f]);
        assert!(
            table.contains("| node-2 | finished, after 1 restart |"),
            "{table}"
        );
    }
}
