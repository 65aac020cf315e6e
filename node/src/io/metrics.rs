//! Per-step metrics as JSON lines, and the progress display.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use slowmo_runspec::StepRecord;

/// Appends one JSON object per step to a file, flushed every line so a crash
/// loses nothing already reported.
pub struct MetricsWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl MetricsWriter {
    /// Creates (truncates) the file.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating directory {}", dir.display()))?;
        }
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            out: BufWriter::new(file),
        })
    }

    /// Writes one record.
    pub fn write(&mut self, record: &StepRecord) -> anyhow::Result<()> {
        self.write_json(record)
    }

    /// Writes one record of a simulated worker, with a `worker` field.
    pub fn write_worker(&mut self, worker: usize, record: &StepRecord) -> anyhow::Result<()> {
        #[derive(serde::Serialize)]
        struct Tagged<'a> {
            worker: usize,
            #[serde(flatten)]
            record: &'a StepRecord,
        }
        self.write_json(&Tagged { worker, record })
    }

    fn write_json(&mut self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")?;
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Flushes and syncs the file at the end of a run (a pipe or a device
    /// that cannot be synced is only flushed).
    pub fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()?;
        match self.out.get_ref().sync_all() {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
            other => other,
        }
    }
}

/// Progress on a terminal as a bar, otherwise as a log line every `every` steps.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    every: u64,
    prefix: String,
}

impl Progress {
    /// A progress display for `total` steps.
    pub fn new(total: u64, prefix: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} {per_sec} eta {eta} {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(prefix.to_owned());
            bar
        });
        Self {
            bar,
            every: (total / 20).max(1),
            prefix: prefix.to_owned(),
        }
    }

    /// Shows a step.
    pub fn step(&self, r: &StepRecord) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.step + 1);
                bar.set_message(format!("loss {:.4}", r.loss));
            }
            None => {
                if (r.step + 1).is_multiple_of(self.every) || r.test_accuracy.is_some() {
                    let mut line = format!(
                        "{} step {} loss {:.4} lr {:.4} weight {:.4} sent {} B",
                        self.prefix,
                        r.step + 1,
                        r.loss,
                        r.lr,
                        r.weight,
                        r.bytes_sent
                    );
                    if let Some(acc) = r.test_accuracy {
                        line.push_str(&format!(" test acc {acc:.4}"));
                    }
                    if let Some(d) = r.consensus_distance {
                        line.push_str(&format!(" consensus {d:.3e}"));
                    }
                    eprintln!("{line}");
                }
            }
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
