//! Output files: checked before a run starts, written atomically, and
//! every failure collected with its flag and path (README, "Outputs and
//! stopping").
//!
//! Every output path of `slowmo simulate`, `slowmo node` and
//! `slowmo-testnet local` is checked at start-up, before any training or
//! networking: a file output must not be a directory, a symbolic link, a
//! device, a fifo or a socket (it is replaced by a new file), and its folder
//! must exist and accept new files; a folder output (checkpoints, the
//! testnet's `--out`) is created if missing and must accept new files. The
//! metrics stream is the one exception: it is appended to line by line, so
//! a fifo or a character device (a pipe, `/dev/stdout`) is accepted there.
//!
//! Files are written through a temporary file in the same folder: fsync,
//! rename, fsync of the folder, so a reader sees the old file or the new
//! one, never a part.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What an output path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A file replaced atomically (summary, parameters).
    File,
    /// A file appended to as the run goes (metrics); may be a fifo or a
    /// character device.
    Stream,
    /// A folder the run writes files into (created if missing).
    Folder,
}

/// An output path that cannot be used, named by its flag.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {}: {reason}", path.display())]
pub struct OutputError {
    pub flag: String,
    pub path: PathBuf,
    pub reason: String,
}

fn refuse(flag: &str, path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError {
        flag: flag.to_string(),
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The folder a file path is in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// What a path that is not a regular file or folder is, in words.
#[cfg(unix)]
fn special_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a fifo"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "not a regular file"
}

/// Whether a stream output may be this special file (a pipe or a
/// character device such as /dev/stdout).
#[cfg(unix)]
fn streamable(ft: &std::fs::FileType) -> bool {
    use std::os::unix::fs::FileTypeExt;
    ft.is_fifo() || ft.is_char_device()
}

#[cfg(not(unix))]
fn streamable(_: &std::fs::FileType) -> bool {
    false
}

/// Creates and removes a probe file in `dir`: the one test of "new files
/// can be made here" that also holds for root, read-only mounts and /proc.
/// Its name is unique to the process and the call, so nodes probing one
/// folder at once (processes, or threads of one program) never collide.
fn probe(flag: &str, path: &Path, dir: &Path) -> Result<(), OutputError> {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!(".slowmo-probe-{}-{n}", std::process::id());
    let file = dir.join(name);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
    {
        Ok(f) => {
            drop(f);
            let _ = std::fs::remove_file(&file);
            Ok(())
        }
        Err(e) => Err(refuse(
            flag,
            path,
            format!("cannot create files in {}: {e}", dir.display()),
        )),
    }
}

/// The folder a file output goes into must exist and accept new files.
fn check_folder_of(flag: &str, path: &Path) -> Result<(), OutputError> {
    let dir = parent_of(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => probe(flag, path, dir),
        Ok(_) => Err(refuse(
            flag,
            path,
            format!("{} is not a folder", dir.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(refuse(
            flag,
            path,
            format!("the folder {} does not exist", dir.display()),
        )),
        Err(e) => Err(refuse(flag, path, format!("{}: {e}", dir.display()))),
    }
}

/// Checks one output path (see the module docs); a folder output is
/// created if missing.
pub fn check(flag: &str, path: &Path, kind: OutputKind) -> Result<(), OutputError> {
    if path.as_os_str().is_empty() {
        return Err(refuse(flag, path, "the path is empty"));
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m),
        // The folder checks below say what is wrong with the folder.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            None
        }
        Err(e) => return Err(refuse(flag, path, e.to_string())),
    };
    match kind {
        OutputKind::Folder => {
            // A link to a folder is fine here: files are written inside it.
            match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(refuse(flag, path, "exists and is not a folder")),
                Err(_) if meta.is_some() => {
                    return Err(refuse(flag, path, "is a symbolic link to nothing"));
                }
                Err(_) => std::fs::create_dir_all(path)
                    .map_err(|e| refuse(flag, path, format!("cannot create the folder: {e}")))?,
            }
            probe(flag, path, path)
        }
        OutputKind::File | OutputKind::Stream => {
            if path.file_name().is_none() {
                return Err(refuse(flag, path, "does not name a file"));
            }
            if let Some(m) = &meta {
                let ft = m.file_type();
                if ft.is_dir() {
                    return Err(refuse(flag, path, "is a folder; give a file name"));
                }
                if ft.is_symlink() && kind == OutputKind::File {
                    return Err(refuse(
                        flag,
                        path,
                        "is a symbolic link; the file is replaced by a new one, which would \
                         replace the link: give the link's target instead",
                    ));
                }
                if kind == OutputKind::Stream {
                    let target = std::fs::metadata(path)
                        .map_err(|e| refuse(flag, path, format!("cannot follow the link: {e}")))?;
                    let ft = target.file_type();
                    if ft.is_dir() {
                        return Err(refuse(flag, path, "is a folder; give a file name"));
                    }
                    if streamable(&ft) {
                        return Ok(());
                    }
                    if !ft.is_file() {
                        return Err(refuse(flag, path, special_kind(&ft)));
                    }
                } else if !ft.is_file() {
                    return Err(refuse(
                        flag,
                        path,
                        format!(
                            "is {}, not a regular file; the file is replaced by a new one, \
                             which would replace it",
                            special_kind(&ft)
                        ),
                    ));
                }
            }
            check_folder_of(flag, path)
        }
    }
}

/// Checks every output given (`None`s are skipped) and reports all that
/// fail at once; also refuses two outputs with the same path.
pub fn check_all(outputs: &[(&str, Option<&Path>, OutputKind)]) -> anyhow::Result<()> {
    let mut errors = Vec::new();
    let given: Vec<_> = outputs
        .iter()
        .filter_map(|(f, p, k)| p.map(|p| (*f, p, *k)))
        .collect();
    for (i, (flag, path, kind)) in given.iter().enumerate() {
        if let Some((other, _, _)) = given[..i].iter().find(|(_, p, _)| p == path) {
            errors.push(format!(
                "{flag} {}: the same path as {other}",
                path.display()
            ));
            continue;
        }
        if let Err(e) = check(flag, path, *kind) {
            errors.push(e.to_string());
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(anyhow::anyhow!("{}", errors[0])),
        _ => Err(anyhow::anyhow!(
            "{} outputs cannot be written:\n  {}",
            errors.len(),
            errors.join("\n  ")
        )),
    }
}

/// The output files of a run, by flag: the one table `slowmo simulate` and
/// `slowmo node` check before they start.
#[derive(Debug, Clone, Default)]
pub struct OutputPaths {
    pub summary_json: Option<PathBuf>,
    pub metrics_jsonl: Option<PathBuf>,
    pub save_params: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
}

impl OutputPaths {
    /// Every output with its flag and what it must be.
    pub fn table(&self) -> [(&'static str, Option<&Path>, OutputKind); 4] {
        [
            (
                "--summary-json",
                self.summary_json.as_deref(),
                OutputKind::File,
            ),
            (
                "--metrics-jsonl",
                self.metrics_jsonl.as_deref(),
                OutputKind::Stream,
            ),
            (
                "--save-params",
                self.save_params.as_deref(),
                OutputKind::File,
            ),
            (
                "--checkpoint-dir",
                self.checkpoint_dir.as_deref(),
                OutputKind::Folder,
            ),
        ]
    }

    /// [`check_all`] over the table.
    pub fn check(&self) -> anyhow::Result<()> {
        check_all(&self.table())
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder:
/// fsync, rename, fsync of the folder. A reader sees the old file or the new
/// one, never a part.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = parent_of(path);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The failures of writing a run's outputs at its end; each is reported
/// on stderr at once and kept for the summary.
#[derive(Debug, Default)]
pub struct OutputErrors(pub Vec<String>);

impl OutputErrors {
    /// Records a failed write of `flag PATH` (nothing when it succeeded).
    pub fn note<E: std::fmt::Display>(&mut self, flag: &str, path: &Path, result: Result<(), E>) {
        if let Err(e) = result {
            let line = format!("{flag} {}: {e}", path.display());
            eprintln!("error: writing {line}");
            self.0.push(line);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_outputs_refuse_folders_links_devices_and_missing_folders() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("summary.json");
        check("--summary-json", &ok, OutputKind::File).unwrap();
        let e = check("--summary-json", dir.path(), OutputKind::File).unwrap_err();
        assert!(e.to_string().contains("is a folder"), "{e}");
        let missing = dir.path().join("no/such/summary.json");
        let e = check("--summary-json", &missing, OutputKind::File).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::write(&ok, b"{}").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        let e = check("--save-params", &link, OutputKind::File).unwrap_err();
        assert!(
            e.to_string().starts_with("--save-params") && e.to_string().contains("symbolic link"),
            "{e}"
        );
        let e = check("--save-params", Path::new("/dev/null"), OutputKind::File).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        check(
            "--metrics-jsonl",
            Path::new("/dev/null"),
            OutputKind::Stream,
        )
        .unwrap();
        check("--metrics-jsonl", &link, OutputKind::Stream).unwrap();
        // nothing is left behind by the probes
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn folder_outputs_are_created_and_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("a/b");
        check("--checkpoint-dir", &ck, OutputKind::Folder).unwrap();
        assert!(ck.is_dir());
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = check("--checkpoint-dir", &file, OutputKind::Folder).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");
        let e = check_all(&[
            ("--summary-json", Some(&file), OutputKind::File),
            ("--save-params", Some(&file), OutputKind::File),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("same path as --summary-json"), "{e}");
    }

    #[test]
    fn atomic_writes_replace_the_file_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = write_atomically(&dir.path().join("no/such/file"), b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
