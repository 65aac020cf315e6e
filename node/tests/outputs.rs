//! Outputs through the `slowmo` binary: every output path is checked before
//! training (and before a node joins anyone), a write error during the run
//! stops it with the parameters still written and the error in the summary,
//! a symbolic link or a device is never replaced, a non-UTF-8 data folder is
//! a clear error, and SIGTERM to a node blocked on a frozen peer writes its
//! summary and current parameters (marked not final) within seconds.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{slowmo, text};

const SMALL: [&str; 8] = [
    "--hidden",
    "8",
    "--batch-size",
    "8",
    "--eval-every",
    "0",
    "--seed",
    "3",
];

/// A one-node run (it needs no peer) with `extra` flags.
fn node_alone(steps: u64, extra: &[&OsStr]) -> Output {
    slowmo()
        .args([
            "node",
            "--nodes",
            "1",
            "--threads",
            "1",
            "--run-id",
            "alone",
        ])
        .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--join-timeout", "20"])
        .args(["--steps", &steps.to_string()])
        .args(SMALL)
        .args(extra)
        .output()
        .unwrap()
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn summary(path: &Path) -> serde_json::Value {
    let t = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&t).unwrap()
}

/// The tensors' count and the metadata of a safetensors file.
fn params(path: &Path) -> (usize, Option<std::collections::HashMap<String, String>>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    (st.len(), meta.metadata().clone())
}

#[test]
fn a_bad_output_path_is_refused_before_training_or_joining() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let params = dir.path().join("params.safetensors");
    // A run of 2 nodes with nobody else: only the join would end it.
    let out = slowmo()
        .args([
            "node",
            "--nodes",
            "2",
            "--threads",
            "1",
            "--join-timeout",
            "60",
        ])
        .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--steps", "50"])
        .args(SMALL)
        .args(["--summary-json", "/proc/forbidden.json"])
        .arg("--metrics-jsonl")
        .arg(&metrics)
        .arg("--save-params")
        .arg(&params)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("--summary-json /proc/forbidden.json"),
        "the flag and path are named: {t}"
    );
    assert!(
        !t.contains("joining the run"),
        "refused before joining: {t}"
    );
    assert!(!metrics.exists() && !params.exists(), "{t}");

    // A folder that is a file, for the metrics.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let out = slowmo()
        .args([
            "node",
            "--nodes",
            "2",
            "--threads",
            "1",
            "--join-timeout",
            "60",
        ])
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .args(SMALL)
        .arg("--metrics-jsonl")
        .arg(file.join("metrics.jsonl"))
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("--metrics-jsonl") && t.contains("is not a folder"),
        "{t}"
    );
    assert!(!t.contains("joining the run"), "{t}");

    // The simulator too: nothing is trained.
    let out = slowmo()
        .args(["simulate", "--workers", "2", "--steps", "20"])
        .args(SMALL)
        .args(["--summary-json", "/proc/forbidden.json"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("--summary-json /proc/forbidden.json"), "{t}");
    assert!(!t.contains("simulating"), "refused before training: {t}");
}

#[test]
fn a_metrics_write_error_stops_the_run_and_the_parameters_are_still_written() {
    let dir = tempfile::tempdir().unwrap();
    let params_path = dir.path().join("params.safetensors");
    let summary_path = dir.path().join("summary.json");
    let out = node_alone(
        200,
        &[
            os("--metrics-jsonl"),
            os("/dev/full"),
            os("--save-params"),
            params_path.as_os_str(),
            os("--summary-json"),
            summary_path.as_os_str(),
        ],
    );
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("--metrics-jsonl /dev/full") && t.contains("No space left on device"),
        "the error names the flag, the path and the reason: {t}"
    );
    let s = summary(&summary_path);
    assert_eq!(s["completed"], false, "{s}");
    assert_eq!(s["stopped"], "output error", "{s}");
    assert_eq!(s["params_final"], false, "{s}");
    let errors = s["output_errors"].as_array().unwrap();
    assert!(
        errors.len() == 1 && errors[0].as_str().unwrap().contains("/dev/full"),
        "{s}"
    );
    assert!(
        s["steps"].as_u64().unwrap() < 200,
        "training stopped early: {s}"
    );
    let (tensors, meta) = params(&params_path);
    assert!(tensors > 0);
    assert_eq!(
        meta.unwrap().get("slowmo.final").map(String::as_str),
        Some("false")
    );
    assert!(
        std::fs::metadata("/dev/full")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

#[test]
fn a_finished_run_writes_final_parameters_and_a_completed_summary() {
    let dir = tempfile::tempdir().unwrap();
    let params_path = dir.path().join("params.safetensors");
    let summary_path = dir.path().join("summary.json");
    let metrics = dir.path().join("metrics.jsonl");
    let out = node_alone(
        30,
        &[
            os("--metrics-jsonl"),
            metrics.as_os_str(),
            os("--save-params"),
            params_path.as_os_str(),
            os("--summary-json"),
            summary_path.as_os_str(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let s = summary(&summary_path);
    assert_eq!(s["completed"], true, "{s}");
    assert_eq!(s["params_final"], true, "{s}");
    assert!(
        s.get("stopped").is_none() && s.get("output_errors").is_none(),
        "{s}"
    );
    assert_eq!(
        std::fs::read_to_string(&metrics).unwrap().lines().count(),
        30
    );
    assert_eq!(
        params(&params_path).1,
        None,
        "final parameters carry no marker"
    );
    // nothing but the three outputs is left in the folder
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
}

/// A copy of /dev/full (the same device numbers) in `dir`, so that a
/// regression replaces the copy and not the machine's device; a fifo where
/// device nodes cannot be made (not root).
fn device_in(dir: &Path) -> (std::path::PathBuf, &'static str) {
    let path = dir.join("full");
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mknod(2)/mkfifo(3) with a valid C string.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 7)) };
    if made == 0 {
        return (path, "character device");
    }
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    (path, "fifo")
}

#[test]
fn save_params_never_replaces_a_link_or_a_device() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.safetensors");
    std::fs::write(&target, b"keep me").unwrap();
    let link = dir.path().join("link.safetensors");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (device, kind) = device_in(dir.path());
    for (path, what) in [(link.as_path(), "symbolic link"), (device.as_path(), kind)] {
        let out = slowmo()
            .args(["simulate", "--workers", "2", "--steps", "20"])
            .args(SMALL)
            .arg("--save-params")
            .arg(path)
            .output()
            .unwrap();
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(
            t.contains(&format!("--save-params {}", path.display())) && t.contains(what),
            "{t}"
        );
        assert!(!t.contains("simulating"), "refused before training: {t}");
        let out = node_alone(10, &[os("--save-params"), path.as_os_str()]);
        let t = text(&out);
        assert!(!out.status.success() && t.contains(what), "{t}");
        assert!(!t.contains("joining the run"), "{t}");
    }
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    let ft = std::fs::symlink_metadata(&device).unwrap().file_type();
    assert!(
        ft.is_char_device() || ft.is_fifo(),
        "the device is still one"
    );
}

#[test]
fn a_non_utf8_data_dir_is_a_clear_error_and_a_non_utf8_output_path_works() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join(OsStr::from_bytes(b"data-\xff"));
    std::fs::create_dir_all(&bad).unwrap();
    let node = node_alone(10, &[os("--data-dir"), bad.as_os_str()]);
    let sim = slowmo()
        .args(["simulate", "--workers", "2", "--steps", "10"])
        .args(SMALL)
        .arg("--data-dir")
        .arg(&bad)
        .arg("--summary-json")
        .arg(dir.path().join("s.json"))
        .output()
        .unwrap();
    for out in [node, sim] {
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "an error, not a panic: {t}");
        assert!(t.contains("--data-dir") && t.contains("UTF-8"), "{t}");
        assert!(!t.contains("panicked"), "{t}");
    }
    // An output path that is not UTF-8 is written as given.
    let summary_path = dir.path().join(OsStr::from_bytes(b"summary-\xfe.json"));
    let params_path = dir
        .path()
        .join(OsStr::from_bytes(b"params-\xfe.safetensors"));
    let out = slowmo()
        .args(["simulate", "--workers", "2", "--steps", "10", "--quiet"])
        .args(SMALL)
        .arg("--summary-json")
        .arg(&summary_path)
        .arg("--save-params")
        .arg(&params_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(summary(&summary_path)["steps"], 10);
    assert!(params(&params_path).0 > 0);
}

/// A node of a 2-node all-reduce run that would take minutes.
fn spawn_node(dir: &Path, name: &str, listen: &str, bootstrap: Option<&str>) -> Child {
    let mut cmd = slowmo();
    cmd.args(["node", "--nodes", "2", "--threads", "1", "--run-id", "stop"])
        .args(["--preset", "ar-sgd", "--steps", "1000000"])
        .args(SMALL)
        .args(["--listen", listen])
        .args(["--join-timeout", "60", "--peer-timeout", "60"])
        .arg("--metrics-jsonl")
        .arg(dir.join(format!("{name}.jsonl")))
        .arg("--summary-json")
        .arg(dir.join(format!("{name}.json")))
        .arg("--save-params")
        .arg(dir.join(format!("{name}.safetensors")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
    if let Some(b) = bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    cmd.spawn().unwrap()
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Two nodes train; the second is frozen (SIGSTOP), so the first blocks in
/// an exchange; `signals` SIGTERMs go to the first. Returns how long it took
/// to exit, its folder and its log.
fn stop_a_blocked_node(signals: usize) -> (Duration, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    // a picks its own port and b dials the address a says it listens on:
    // a port chosen here could be taken by another test's node before a
    // binds it.
    let mut a = spawn_node(dir.path(), "a", "/ip4/127.0.0.1/tcp/0", None);
    let until = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        let said = log("a.log").lines().find_map(|l| {
            let (_, rest) = l.split_once("listening on ")?;
            Some(rest.split_whitespace().next()?.to_string())
        });
        if let Some(addr) = said {
            break addr;
        }
        if Instant::now() > until || a.try_wait().unwrap().is_some() {
            let _ = a.kill();
            panic!("a did not say where it listens: {}", log("a.log"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut b = spawn_node(dir.path(), "b", "/ip4/127.0.0.1/tcp/0", Some(&addr));
    let until = Instant::now() + Duration::from_secs(90);
    while lines(&dir.path().join("a.jsonl")) < 20 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    if lines(&dir.path().join("a.jsonl")) < 20 {
        for c in [&mut a, &mut b] {
            let _ = c.kill();
            let _ = c.wait();
        }
        panic!(
            "the run did not start\n--- a.log\n{}\n--- b.log\n{}",
            log("a.log"),
            log("b.log")
        );
    }
    signal(&b, libc::SIGSTOP);
    // a is blocked in an exchange with b now: its steps stop.
    std::thread::sleep(Duration::from_millis(500));
    let frozen_at = lines(&dir.path().join("a.jsonl"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        lines(&dir.path().join("a.jsonl")),
        frozen_at,
        "a is blocked"
    );
    let sent = Instant::now();
    for _ in 0..signals {
        signal(&a, libc::SIGTERM);
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = sent + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = a.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = sent.elapsed();
    let _ = a.kill();
    let _ = a.wait();
    let _ = b.kill();
    signal(&b, libc::SIGCONT);
    let _ = b.wait();
    let log_a = log("a.log");
    let status = status.unwrap_or_else(|| panic!("a did not exit within 20 s: {log_a}"));
    assert!(!status.success(), "a stopped run is not a success: {log_a}");
    (took, dir, log_a)
}

fn assert_stopped_by_signal(dir: &Path, log: &str) {
    let s = summary(&dir.join("a.json"));
    assert_eq!(s["completed"], false, "{s}");
    assert_eq!(s["stopped"], "signal", "{s}");
    assert_eq!(s["params_final"], false, "{s}");
    assert!(s["steps"].as_u64().unwrap() >= 20, "{s}");
    let (tensors, meta) = params(&dir.join("a.safetensors"));
    assert!(tensors > 0, "{log}");
    let meta = meta.unwrap();
    assert_eq!(meta.get("slowmo.final").map(String::as_str), Some("false"));
    assert!(lines(&dir.join("a.jsonl")) >= 20);
}

#[test]
fn sigterm_interrupts_a_blocked_exchange_and_writes_the_current_parameters() {
    let (took, dir, log) = stop_a_blocked_node(1);
    // The peer timeout is 60 s: only the interrupt ends the wait this soon.
    assert!(took < Duration::from_secs(10), "took {took:?}: {log}");
    assert_stopped_by_signal(dir.path(), &log);
    assert!(log.contains("stopping: writing"), "{log}");
}

#[test]
fn a_second_sigterm_still_leaves_the_parameters_and_summary() {
    let (took, dir, log) = stop_a_blocked_node(2);
    assert!(took < Duration::from_secs(10), "took {took:?}: {log}");
    assert_stopped_by_signal(dir.path(), &log);
}
