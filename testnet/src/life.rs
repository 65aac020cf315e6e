//! A restarted node's earlier lives. A node writes its metrics and summary
//! afresh in every life, so before it starts again the files of the life
//! that ended are kept beside the new ones, as `metrics.K.jsonl` and
//! `summary.K.json`, K = 1 for its first life, 2 for its second, ...
//!
//! The one rule, for local runs (the node's own folder) and compose
//! testnets (the results folder, the files copied out of the container):
//! K is the first number for which neither `metrics.K.jsonl` nor
//! `summary.K.json` exists yet; each of the two files the ended life left is
//! kept under K, a file it did not leave is not made up; and a life that
//! left neither takes no number.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The files of one life, each with the stem and extension of its kept
/// copies.
const LIFE_FILES: [(&str, &str, &str); 2] = [
    ("metrics.jsonl", "metrics", "jsonl"),
    ("summary.json", "summary", "json"),
];

/// The number the next kept life takes in `dir`.
pub fn next_life(dir: &Path) -> u32 {
    let mut k = 1;
    while LIFE_FILES
        .iter()
        .any(|(_, stem, ext)| dir.join(format!("{stem}.{k}.{ext}")).exists())
    {
        k += 1;
    }
    k
}

/// Keeps the files of a life that ended in `dir` under the next free
/// number. `keep(name, target)` moves or copies the ended life's file
/// `name` to `target` and answers whether there was such a file. Returns
/// the number taken, `None` when the life left neither file.
pub fn keep_earlier_life(
    dir: &Path,
    mut keep: impl FnMut(&str, &Path) -> anyhow::Result<bool>,
) -> anyhow::Result<Option<u32>> {
    let k = next_life(dir);
    let mut kept = false;
    for (name, stem, ext) in LIFE_FILES {
        let target: PathBuf = dir.join(format!("{stem}.{k}.{ext}"));
        kept |= keep(name, &target)?;
    }
    Ok(kept.then_some(k))
}

/// [`keep_earlier_life`] for a node that writes into `dir` itself (a
/// local run): its files are renamed.
pub fn keep_in_place(dir: &Path) -> anyhow::Result<Option<u32>> {
    keep_earlier_life(dir, |name, target| {
        let from = dir.join(name);
        if !from.exists() {
            return Ok(false);
        }
        std::fs::rename(&from, target)
            .with_context(|| format!("renaming {} to {}", from.display(), target.display()))?;
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_life_is_kept_under_the_next_free_number() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("metrics.jsonl"), "life 1\n").unwrap();
        assert_eq!(keep_in_place(d).unwrap(), Some(1));
        std::fs::write(d.join("metrics.jsonl"), "life 2\n").unwrap();
        std::fs::write(d.join("summary.json"), "{}").unwrap();
        assert_eq!(keep_in_place(d).unwrap(), Some(2));
        assert_eq!(
            std::fs::read_to_string(d.join("metrics.1.jsonl")).unwrap(),
            "life 1\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.join("metrics.2.jsonl")).unwrap(),
            "life 2\n"
        );
        assert!(d.join("summary.2.json").exists());
        assert!(!d.join("summary.1.json").exists(), "none was left");
        assert!(!d.join("metrics.jsonl").exists());
        // Nothing to keep takes no number.
        assert_eq!(keep_in_place(d).unwrap(), None);
        assert_eq!(next_life(d), 3);
    }

    #[test]
    fn a_number_taken_by_either_file_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Only a summary was kept for life 1 (the metrics went missing).
        std::fs::write(d.join("summary.1.json"), "{}").unwrap();
        assert_eq!(next_life(d), 2);
        // A copy from elsewhere (a container) goes through the same rule.
        let k = keep_earlier_life(d, |name, target| {
            std::fs::write(target, name)?;
            Ok(true)
        })
        .unwrap();
        assert_eq!(k, Some(2));
        assert_eq!(
            std::fs::read_to_string(d.join("metrics.2.jsonl")).unwrap(),
            "metrics.jsonl"
        );
    }
}
