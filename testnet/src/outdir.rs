//! The `--out` folder of `slowmo-testnet local`: checked before any node
//! starts, and never shared by two runs (README, "Outputs and stopping").
//!
//! A folder that is not empty is refused unless `--force`; with `--force`
//! the files of an earlier run (`run.toml`, `testnet.json`, `events.jsonl`,
//! `fates.json`, `results.md`, `results.json` and the `node-N` folders) are
//! removed first, so that no file of the earlier run stays beside the new
//! one's.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// Whether a folder entry was written by a local run.
fn is_run_file(name: &str) -> bool {
    matches!(
        name,
        "run.toml" | "testnet.json" | "events.jsonl" | "fates.json" | "results.md" | "results.json"
    ) || name
        .strip_prefix("node-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The entries of `dir` (names), sorted.
fn entries(dir: &Path) -> anyhow::Result<Vec<(std::ffi::OsString, PathBuf)>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("--out {}: {e}", dir.display()))? {
        let e = e.map_err(|e| anyhow::anyhow!("--out {}: {e}", dir.display()))?;
        found.push((e.file_name(), e.path()));
    }
    found.sort();
    Ok(found)
}

/// Makes `out` ready for a new run: creates it, or checks that it is an
/// empty folder that accepts files; with `force`, clears an earlier run's
/// files from it first.
pub fn prepare(out: &Path, force: bool) -> anyhow::Result<()> {
    let shown = out.display();
    match std::fs::metadata(out) {
        Ok(m) if !m.is_dir() => bail!("--out {shown}: exists and is not a folder"),
        Ok(_) => {
            let found = entries(out)?;
            let earlier: Vec<_> = found
                .iter()
                .filter(|(n, _)| n.to_str().is_some_and(is_run_file))
                .collect();
            if !found.is_empty() && !force {
                let what = if earlier.is_empty() {
                    format!("holds {} other file(s)", found.len())
                } else {
                    "holds an earlier run (run.toml, node-N folders)".to_string()
                };
                bail!(
                    "--out {shown}: the folder is not empty: it {what}; choose a new folder, \
                     or pass --force to remove the earlier run's files first"
                );
            }
            for (_, path) in earlier {
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(path)
                } else {
                    std::fs::remove_file(path)
                };
                removed.map_err(|e| {
                    anyhow::anyhow!("--out {shown}: removing {}: {e}", path.display())
                })?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(out)
            .map_err(|e| anyhow::anyhow!("--out {shown}: cannot create the folder: {e}"))?,
        Err(e) => bail!("--out {shown}: {e}"),
    }
    // New files can be made there (also for root on a read-only mount).
    let probe = out.join(format!(".slowmo-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| anyhow::anyhow!("--out {shown}: cannot create files in it: {e}"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_run_is_refused_and_cleared_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        prepare(&out, false).unwrap();
        prepare(&out, false).unwrap();
        std::fs::create_dir_all(out.join("node-0")).unwrap();
        std::fs::write(out.join("node-0/params.safetensors"), b"old").unwrap();
        std::fs::write(out.join("run.toml"), b"").unwrap();
        std::fs::write(out.join("notes.txt"), b"mine").unwrap();
        let e = prepare(&out, false).unwrap_err().to_string();
        assert!(e.contains("earlier run") && e.contains("--force"), "{e}");
        assert!(out.join("node-0/params.safetensors").exists());
        prepare(&out, true).unwrap();
        let left: Vec<_> = entries(&out).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("notes.txt")]);
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = prepare(&file, true).unwrap_err().to_string();
        assert!(e.contains("not a folder"), "{e}");
    }
}
