//! Step gates: how a harness plays a fault at exactly a base step of a run
//! of real processes.
//!
//! A node started with `--hold-at S` and a gate folder stops before base
//! step `S` (when it has completed `S` steps) and waits there until the
//! harness opens the gate. While it waits it keeps its file `held-S` in the
//! folder up to date with the number of nodes it knows to be waiting to
//! join; a node that trains as a member of a view keeps a file `member`
//! there. The harness waits until every member holds at `S`, carries out
//! the faults of step `S` (a kill, a restart or a join: then it also waits
//! until every held member has heard the new node ask to join), and writes
//! `open-S` into every node's gate folder. A node reaching `S` again after
//! a view change went back to an earlier barrier finds the gate open and
//! goes on. The simulator needs none of this: it notices a scripted fault
//! at the fault's own step.
//!
//! Files are written whole (a temporary file renamed into place), so a
//! reader never sees half of one.

use std::io;
use std::path::{Path, PathBuf};

/// The file a node keeps in its gate folder while it trains as a member.
pub const MEMBER_FILE: &str = "member";

/// The file of a node holding at step `step`.
pub fn held_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("held-{step}"))
}

/// The file that opens the gate at step `step`.
pub fn open_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("open-{step}"))
}

/// Writes `text` to `path` whole.
fn write_whole(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// A node holds at `step`, knowing `joiners` nodes that wait to join.
pub fn write_held(dir: &Path, step: u64, joiners: usize) -> io::Result<()> {
    write_whole(&held_file(dir, step), &format!("joiners {joiners}\n"))
}

/// The node goes on past `step`.
pub fn remove_held(dir: &Path, step: u64) -> io::Result<()> {
    match std::fs::remove_file(held_file(dir, step)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The joiners a node holding at `step` knows of; `None` when it does not
/// hold there.
pub fn read_held(dir: &Path, step: u64) -> Option<usize> {
    let text = std::fs::read_to_string(held_file(dir, step)).ok()?;
    text.trim().strip_prefix("joiners ")?.parse().ok()
}

/// Marks (or unmarks) a node as a member that trains.
pub fn set_member(dir: &Path, member: bool) -> io::Result<()> {
    let path = dir.join(MEMBER_FILE);
    if member {
        write_whole(&path, "member\n")
    } else {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Whether a node marked itself a member.
pub fn is_member(dir: &Path) -> bool {
    dir.join(MEMBER_FILE).exists()
}

/// Opens the gate at `step` in `dir`.
pub fn open(dir: &Path, step: u64) -> io::Result<()> {
    write_whole(&open_file(dir, step), "open\n")
}

/// Whether the gate at `step` is open in `dir`.
pub fn is_open(dir: &Path, step: u64) -> bool {
    open_file(dir, step).exists()
}

/// Clears what a node wrote in its gate folder (held and member files),
/// keeping the opened gates: a node starting a new life.
pub fn clear_node_files(dir: &Path) -> io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name == MEMBER_FILE || name.starts_with("held-") {
            std::fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_member_and_open_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(read_held(d, 7), None);
        write_held(d, 7, 2).unwrap();
        assert_eq!(read_held(d, 7), Some(2));
        write_held(d, 7, 3).unwrap();
        assert_eq!(read_held(d, 7), Some(3));
        remove_held(d, 7).unwrap();
        assert_eq!(read_held(d, 7), None);
        remove_held(d, 7).unwrap();
        write_held(d, 7, 3).unwrap();
        assert!(!is_member(d));
        set_member(d, true).unwrap();
        assert!(is_member(d));
        assert!(!is_open(d, 7));
        open(d, 7).unwrap();
        assert!(is_open(d, 7));
        clear_node_files(d).unwrap();
        assert_eq!(read_held(d, 7), None);
        assert!(!is_member(d));
        assert!(is_open(d, 7), "opened gates stay");
        set_member(d, false).unwrap();
    }
}
