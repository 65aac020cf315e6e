//! README's "Train on your machines", run as written: the commands of its
//! `sh` block, on three machines made of network namespaces on one LAN,
//! each behind a firewall that admits new connections only to the ports
//! README says to open. Machine A starts the run and prints a join ticket;
//! B and C join with it and nothing else (no settings file). All three end
//! with identical parameters, the simulator's, and the tensors went over
//! the data lane, not the libp2p fallback.
//!
//! Needs root (`ip netns`, nftables); elsewhere the test says it is
//! skipped, and under CI=true it fails instead.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod local_support;
use local_support::{can_make_namespaces, read_json, slowmo_bin};

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).expect("README.md")
}

/// The command lines of the first `sh` block under `heading`, comments and
/// blank lines left out.
fn sh_block(readme: &str, heading: &str) -> Vec<String> {
    let at = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no section `{heading}`"));
    let rest = &readme[at..];
    let start = rest.find("```sh\n").expect("an sh block") + "```sh\n".len();
    let end = rest[start..].find("```").expect("the block's end") + start;
    rest[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// The walkthrough as README gives it: A's command, the joiners' command
/// (with `"$TICKET"` for the ticket) and the TCP ports to open.
struct Walkthrough {
    start: Vec<String>,
    join: Vec<String>,
    ports: Vec<u16>,
}

fn walkthrough() -> Walkthrough {
    let text = readme();
    let lines = sh_block(&text, "## Train on your machines");
    let words =
        |l: &String| -> Vec<String> { l.split_whitespace().map(String::from).collect::<Vec<_>>() };
    let start = lines
        .iter()
        .find(|l| l.starts_with("slowmo node") && !l.contains("--join"))
        .map(words)
        .expect("a `slowmo node` line that starts the run");
    let join = lines
        .iter()
        .find(|l| l.starts_with("slowmo node") && l.contains("--join \"$TICKET\""))
        .map(words)
        .expect("a `slowmo node --join \"$TICKET\"` line");
    assert!(
        lines.iter().any(|l| l.starts_with("TICKET=slowmo1")),
        "the block sets TICKET: {lines:?}"
    );
    // The ports README tells the reader to open, in the section's text.
    let section = &text[text.find("## Train on your machines").unwrap()..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let section = section.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut ports: Vec<u16> = section
        .match_indices("**TCP ")
        .map(|(i, _)| {
            let digits: String = section[i + 6..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().expect("a port after **TCP")
        })
        .collect();
    ports.sort_unstable();
    assert!(
        ports.len() >= 2,
        "README names no listen and lane port to open: {ports:?}"
    );
    // Both commands listen on the first; the lane takes the next.
    for cmd in [&start, &join] {
        let listen = cmd
            .windows(2)
            .find(|w| w[0] == "--listen")
            .map(|w| w[1].clone())
            .expect("--listen");
        assert!(listen.ends_with(&format!("/tcp/{}", ports[0])), "{listen}");
    }
    Walkthrough { start, join, ports }
}

/// The namespaces of one test; removed when dropped.
struct Lan {
    prefix: String,
}

impl Lan {
    fn up(machines: usize, tcp_ports: &[u16]) -> Option<Self> {
        let prefix = format!("w{}", std::process::id() % 100_000);
        if !can_make_namespaces("the walkthrough", &prefix) {
            return None;
        }
        let lan = Lan { prefix };
        let ports: Vec<String> = tcp_ports.iter().map(u16::to_string).collect();
        let status = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/firewall/netns.sh"))
            .args(["up", &machines.to_string()])
            .env("PREFIX", &lan.prefix)
            .env("TCP_PORTS", ports.join(" "))
            .env("UDP_PORTS", "")
            .status()
            .expect("running tools/firewall/netns.sh");
        assert!(status.success(), "building the namespaces failed");
        Some(lan)
    }

    /// `slowmo args...` (README's words after `slowmo`) on machine `k`, in
    /// folder `dir`; standard output to `out.txt`, the log to `node.log`.
    fn spawn(&self, k: usize, args: &[String], dir: &Path) -> Child {
        std::fs::create_dir_all(dir).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &format!("{}-m{k}", self.prefix)])
            .arg("env")
            .args(["RAYON_NUM_THREADS=1", "RUST_LOG=info,libp2p=warn"])
            .arg(slowmo_bin())
            .args(args)
            .current_dir(dir)
            .stdout(std::fs::File::create(dir.join("out.txt")).unwrap())
            .stderr(std::fs::File::create(dir.join("node.log")).unwrap())
            .spawn()
            .expect("starting slowmo in a namespace")
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/firewall/netns.sh"))
            .arg("down")
            .env("PREFIX", &self.prefix)
            .status();
    }
}

/// Waits for a line of `path` that starts with `prefix` (the node prints
/// it once it listens).
fn wait_line(path: &Path, prefix: &str, log: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let Ok(f) = std::fs::File::open(path)
            && let Some(line) = BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .find(|l| l.trim_start().starts_with(prefix))
        {
            return line.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "no line `{prefix}` in {} within a minute; log:\n{}",
        path.display(),
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn after_slowmo(cmd: &[String]) -> Vec<String> {
    assert_eq!(cmd[0], "slowmo");
    cmd[1..].to_vec()
}

#[test]
fn three_firewalled_machines_train_by_ticket_over_the_lane() {
    let walk = walkthrough();
    let Some(lan) = Lan::up(3, &walk.ports) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let folder = |k: usize| -> PathBuf { dir.path().join(format!("m{k}")) };
    let a = lan.spawn(1, &after_slowmo(&walk.start), &folder(1));
    let ports = wait_line(
        &folder(1).join("out.txt"),
        "ports:",
        &folder(1).join("node.log"),
    );
    for p in &walk.ports {
        assert!(
            ports.contains(&format!("TCP {p}")),
            "A's ports line does not name TCP {p}: {ports}"
        );
    }
    let join_line = wait_line(
        &folder(1).join("out.txt"),
        "slowmo node --join ",
        &folder(1).join("node.log"),
    );
    let ticket = join_line
        .split_whitespace()
        .last()
        .expect("a ticket")
        .to_string();
    assert!(ticket.starts_with("slowmo1"), "{join_line}");
    let join: Vec<String> = after_slowmo(&walk.join)
        .into_iter()
        .map(|w| {
            if w == "\"$TICKET\"" {
                ticket.clone()
            } else {
                w
            }
        })
        .collect();
    let mut nodes = vec![(1, a)];
    for k in [2, 3] {
        nodes.push((k, lan.spawn(k, &join, &folder(k))));
    }
    let logs = || -> String {
        (1..=3)
            .map(|k| {
                let log = std::fs::read_to_string(folder(k).join("node.log")).unwrap_or_default();
                format!("--- machine {k}:\n{log}")
            })
            .collect()
    };
    for (k, mut child) in nodes {
        let ok = child.wait().unwrap().success();
        assert!(ok, "machine {k} failed; the logs:\n{}", logs());
    }

    // The same parameters everywhere, and the simulator's: the joiners ran
    // A's settings without being given them.
    let params: Vec<Vec<u8>> = (1..=3)
        .map(|k| std::fs::read(folder(k).join("params.safetensors")).unwrap())
        .collect();
    assert!(
        params[1] == params[0] && params[2] == params[0],
        "parameters differ"
    );
    let settings: Vec<String> = after_slowmo(&walk.start)
        .windows(2)
        .filter(|w| ["--base", "--steps"].contains(&w[0].as_str()))
        .flat_map(|w| w.to_vec())
        .collect();
    let sim = dir.path().join("sim.safetensors");
    let status = Command::new(slowmo_bin())
        .args(["simulate", "--quiet", "--workers", "3"])
        .args(&settings)
        .arg("--save-params")
        .arg(&sim)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        std::fs::read(&sim).unwrap() == params[0],
        "the nodes' parameters are not the simulator's"
    );

    // The tensors took the lane: what went over libp2p streams instead is
    // a small part (the barrier and the typed collectives' blocks may).
    for k in 1..=3 {
        let s = read_json(&folder(k).join("summary.json"));
        assert_eq!(s["completed"], true, "machine {k}: {s}");
        let sent = s["bytes_sent"].as_u64().unwrap();
        let lane = s["lane_bytes_sent"].as_u64().unwrap();
        let fallback = sent - lane;
        println!("machine {k}: {lane} bytes over the lane, {fallback} over libp2p");
        let log = std::fs::read_to_string(folder(k).join("node.log")).unwrap();
        assert!(
            lane > 0 && fallback * 20 <= sent,
            "machine {k}: lane {lane} of {sent}; the logs:\n{}",
            logs()
        );
        assert!(!log.contains("cannot be dialed"), "machine {k}: {log}");
    }
}
