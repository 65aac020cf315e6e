//! SIGTERM and Ctrl-C for `slowmo node`: stop training at once (a blocked
//! exchange is interrupted within about a second) and still write the
//! metrics, the summary and the current parameters (README, "Outputs and
//! stopping").
//!
//! - While joining (nothing trained yet): a summary that says so is
//!   written and the process leaves with status 130.
//! - While training, the first signal stops the loop before the next step
//!   and raises the communicator's [`Interrupt`], so that a wait on a silent
//!   peer returns at once; the node then writes its outputs and exits.
//! - A second signal leaves as soon as the outputs are written (the
//!   parameter file first; at most [`SECOND_SIGNAL_WAIT`] later).

use slowmo_gossip::sync::lock;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use slowmo_gossip::Interrupt;

/// How long a second signal waits for the outputs.
pub const SECOND_SIGNAL_WAIT: Duration = Duration::from_secs(10);

const JOINING: u8 = 0;
const TRAINING: u8 = 1;

#[derive(Default)]
struct Inner {
    signals: AtomicUsize,
    phase: AtomicU8,
    interrupt: Mutex<Option<Interrupt>>,
    outputs_written: AtomicBool,
    /// What to write, and where, when a signal comes while joining.
    joining_summary: Mutex<Option<(PathBuf, Vec<u8>)>>,
}

/// The node's stop state, shared with the signal handler.
#[derive(Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    output_error: Arc<AtomicBool>,
    inner: Arc<Inner>,
}

impl Stopper {
    /// Installs the handler of SIGINT and SIGTERM; `joining_summary` is the
    /// summary file (path and bytes) a signal during the join leaves.
    pub fn install(joining_summary: Option<(PathBuf, Vec<u8>)>) -> anyhow::Result<Self> {
        let s = Stopper {
            stop: Arc::new(AtomicBool::new(false)),
            output_error: Arc::new(AtomicBool::new(false)),
            inner: Arc::new(Inner {
                joining_summary: Mutex::new(joining_summary),
                ..Inner::default()
            }),
        };
        // One handler per process serves every node in it (a program may
        // run several, as `node/examples/custom_model.rs` does); a node
        // that has finished drops out of the list at the next install.
        static LIVE: Mutex<Vec<Stopper>> = Mutex::new(Vec::new());
        static HANDLER: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
        HANDLER
            .get_or_init(|| {
                ctrlc::set_handler(|| {
                    let live = lock(&LIVE).clone();
                    live.iter().for_each(Stopper::on_signal);
                })
                .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(anyhow::Error::msg)
            .context("installing the signal handler")?;
        let mut live = lock(&LIVE);
        live.retain(|l| Arc::strong_count(&l.inner) > 1);
        live.push(s.clone());
        Ok(s)
    }

    fn on_signal(&self) {
        let n = self.inner.signals.fetch_add(1, Ordering::SeqCst) + 1;
        self.stop.store(true, Ordering::SeqCst);
        if let Some(i) = lock(&self.inner.interrupt).as_ref() {
            i.raise();
        }
        if self.inner.phase.load(Ordering::SeqCst) == JOINING {
            if let Some((path, bytes)) = lock(&self.inner.joining_summary).take()
                && let Err(e) = crate::io::outputs::write_atomically(&path, &bytes)
            {
                eprintln!("error: writing --summary-json {}: {e}", path.display());
            }
            eprintln!("stopped by a signal while joining the run; nothing was trained");
            std::process::exit(130);
        }
        if n == 1 {
            eprintln!(
                "stopping: writing metrics, summary and the current parameters \
                 (signal again to leave as soon as they are written)"
            );
            return;
        }
        eprintln!("leaving as soon as the outputs are written");
        let until = Instant::now() + SECOND_SIGNAL_WAIT;
        while !self.inner.outputs_written.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::process::exit(130);
    }

    /// The flag the training loop checks before every step.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The run started: later signals interrupt `interrupt`'s waits (one
    /// that came already does so now).
    pub fn training(&self, interrupt: Interrupt) {
        let mut slot = lock(&self.inner.interrupt);
        if self.stop.load(Ordering::SeqCst) && self.signalled() {
            interrupt.raise();
        }
        *slot = Some(interrupt);
        self.inner.phase.store(TRAINING, Ordering::SeqCst);
    }

    /// An output failed during the run: stop before the next step.
    pub fn stop_for_output_error(&self) {
        self.output_error.store(true, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether a signal asked the node to stop.
    pub fn signalled(&self) -> bool {
        self.inner.signals.load(Ordering::SeqCst) > 0
    }

    /// Why the run was stopped from outside the loop, if it was.
    pub fn reason(&self) -> Option<&'static str> {
        if self.signalled() {
            Some("signal")
        } else if self.output_error.load(Ordering::SeqCst) {
            Some("output error")
        } else {
            None
        }
    }

    /// The outputs are written (or failed, reported): a second signal may
    /// leave now.
    pub fn outputs_written(&self) {
        self.inner.outputs_written.store(true, Ordering::SeqCst);
    }
}
