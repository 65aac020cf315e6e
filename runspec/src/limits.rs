//! Whether this machine can hold a run: `slowmo simulate --workers N` runs N
//! threads in one process, `slowmo-testnet local --nodes N` N processes.
//! Each is checked against the memory available and the process limit
//! before anything starts, with an error naming the flag, the value and the
//! limit.
//!
//! Memory is an estimate: a worker holds about [`BUFFERS_PER_WORKER`]
//! parameter-sized buffers (parameters, gradient, optimizer and slow-momentum
//! state, push-sum shares in flight, the model's own tensors) plus
//! [`WORKER_OVERHEAD_BYTES`] (stack, a batch's activations), about 15 MB for
//! the default MLP; a node process also holds its own copy of the dataset
//! and [`NODE_OVERHEAD_BYTES`] (runtime, transport, buffers).

use crate::kinds::{DatasetKind, ModelKind};
use crate::options::{ConfigError, invalid};
use crate::resolve::RunConfig;
use crate::table::human_bytes;

/// Parameter-sized `f32` buffers one worker holds, about.
pub const BUFFERS_PER_WORKER: u64 = 16;
/// Memory of a worker besides its buffers.
pub const WORKER_OVERHEAD_BYTES: u64 = 2 << 20;
/// Memory of a node process besides its worker and dataset.
pub const NODE_OVERHEAD_BYTES: u64 = 64 << 20;
/// Processes a local testnet starts at most.
pub const MAX_LOCAL_NODES: usize = 256;
/// Threads or processes left for everything else under the process limit.
const PROCESS_HEADROOM: u64 = 64;

/// What this machine offers. `None`: unknown, not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    /// Bytes of memory available (`MemAvailable` in /proc/meminfo).
    pub available_memory: Option<u64>,
    /// The soft limit on processes and threads of this user
    /// (`RLIMIT_NPROC`, "Max processes" in /proc/self/limits).
    pub max_processes: Option<u64>,
}

impl Resources {
    /// Reads /proc (nothing is known elsewhere).
    pub fn of_this_machine() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        Self {
            available_memory: mem_available(&meminfo),
            max_processes: max_processes(&limits),
        }
    }
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => n.checked_mul(1024),
        Some(_) => None,
    }
}

/// The soft "Max processes" of a /proc/self/limits text (`None` if
/// unlimited).
fn max_processes(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max processes"))?;
    line["Max processes".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Image shape and sample counts of a dataset: (values per sample, channels,
/// side, classes, train + test samples).
fn dataset_shape(kind: DatasetKind) -> (u64, u64, u64, u64, u64) {
    match kind {
        DatasetKind::Synthetic => (784, 1, 28, 10, 14_000),
        DatasetKind::FashionMnist | DatasetKind::Mnist => (784, 1, 28, 10, 70_000),
        DatasetKind::Cifar10 => (3072, 3, 32, 10, 60_000),
        // sized by `text_bytes` instead
        DatasetKind::Text => (0, 1, 0, 256, 0),
    }
}

/// Bytes of a text file, or of the files in a folder (0 where unreadable:
/// loading names the path then).
fn text_bytes(path: &std::path::Path) -> u64 {
    let Ok(meta) = std::fs::metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    std::fs::read_dir(path).map_or(0, |entries| {
        entries
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .fold(0, u64::saturating_add)
    })
}

impl RunConfig {
    /// Number of model parameters (the same layouts as the model's).
    pub fn param_count(&self) -> u64 {
        let (sample, channels, side, classes, _) = dataset_shape(self.dataset);
        let linear = |i: u64, o: u64| i.saturating_mul(o).saturating_add(o);
        match self.model {
            ModelKind::Mlp => {
                let mut widths = vec![sample];
                widths.extend(self.hidden.iter().map(|&h| h as u64));
                widths.push(classes);
                widths
                    .windows(2)
                    .fold(0u64, |n, w| n.saturating_add(linear(w[0], w[1])))
            }
            ModelKind::Transformer => self
                .transformer
                .unwrap_or_default()
                .param_count(classes as usize),
            ModelKind::Cnn => {
                // conv1 5x5 "same" + pool, conv2 5x5 + pool, then 120, 84.
                let pooled = (side / 2).saturating_sub(4) / 2;
                [
                    linear(channels * 25, 6),
                    linear(6 * 25, 16),
                    linear(16 * pooled * pooled, 120),
                    linear(120, 84),
                    linear(84, classes),
                ]
                .into_iter()
                .fold(0u64, u64::saturating_add)
            }
        }
    }

    /// Estimated memory of one worker.
    pub fn worker_bytes(&self) -> u64 {
        self.param_count()
            .saturating_mul(4 * BUFFERS_PER_WORKER)
            .saturating_add(WORKER_OVERHEAD_BYTES)
    }

    /// Estimated memory of the dataset as loaded (`f32` values).
    pub fn dataset_bytes(&self) -> u64 {
        if self.dataset == DatasetKind::Text {
            // one f32 per byte, plus one in `context` for the windows' overlap
            return self
                .data_dir
                .as_deref()
                .map_or(0, text_bytes)
                .saturating_mul(5);
        }
        let (sample, _, _, _, samples) = dataset_shape(self.dataset);
        sample * samples * 4
    }

    /// Refuses `--workers` (threads of one simulating process) this machine
    /// cannot hold.
    pub fn check_workers(&self, res: &Resources) -> Result<(), ConfigError> {
        let n = self.workers as u64;
        let each = self.worker_bytes();
        let need = each.saturating_mul(n).saturating_add(self.dataset_bytes());
        if let Some(avail) = res.available_memory
            && need > avail
        {
            return Err(invalid(
                "workers",
                format!(
                    "--workers {n} needs about {} of memory ({} per worker for {} parameters, \
                     plus the dataset), but only {} is available (MemAvailable in /proc/meminfo)",
                    human_bytes(need),
                    human_bytes(each),
                    self.param_count(),
                    human_bytes(avail)
                ),
            ));
        }
        if let Some(max) = res.max_processes
            && n.saturating_add(PROCESS_HEADROOM) > max
        {
            return Err(invalid(
                "workers",
                format!(
                    "--workers {n} runs one thread per worker, but the process limit \
                     (RLIMIT_NPROC, `ulimit -u`) is {max} threads and processes, and {PROCESS_HEADROOM} \
                     are kept for the rest"
                ),
            ));
        }
        Ok(())
    }

    /// Refuses `--nodes` (processes of a local testnet, each running one
    /// worker with its own copy of the dataset) this machine cannot hold.
    pub fn check_local_nodes(&self, nodes: usize, res: &Resources) -> Result<(), ConfigError> {
        let n = nodes as u64;
        if nodes > MAX_LOCAL_NODES {
            return Err(invalid(
                "nodes",
                format!(
                    "--nodes {n} is above {MAX_LOCAL_NODES}, the most node processes a local \
                     testnet starts on one machine"
                ),
            ));
        }
        let each = self
            .worker_bytes()
            .saturating_add(self.dataset_bytes())
            .saturating_add(NODE_OVERHEAD_BYTES);
        let need = each.saturating_mul(n);
        if let Some(avail) = res.available_memory
            && need > avail
        {
            return Err(invalid(
                "nodes",
                format!(
                    "--nodes {n} needs about {} of memory ({} per node process: {} parameters, \
                     the dataset and the runtime), but only {} is available (MemAvailable in \
                     /proc/meminfo)",
                    human_bytes(need),
                    human_bytes(each),
                    self.param_count(),
                    human_bytes(avail)
                ),
            ));
        }
        // Each node runs a few threads (its network runtime, the training thread).
        let threads = n.saturating_mul(8);
        if let Some(max) = res.max_processes
            && threads.saturating_add(PROCESS_HEADROOM) > max
        {
            return Err(invalid(
                "nodes",
                format!(
                    "--nodes {n} starts {n} processes of about 8 threads each, but the process \
                     limit (RLIMIT_NPROC, `ulimit -u`) is {max} threads and processes, and \
                     {PROCESS_HEADROOM} are kept for the rest"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::TrainOptions;

    fn config(flags: TrainOptions) -> RunConfig {
        flags.resolve().unwrap()
    }

    #[test]
    fn the_default_mlp_costs_about_15_mb_per_worker() {
        let c = config(TrainOptions::default());
        assert_eq!(c.param_count(), 784 * 256 + 256 + 256 * 10 + 10);
        let mb = c.worker_bytes() as f64 / 1e6;
        assert!((12.0..18.0).contains(&mb), "{mb} MB");
        let cnn = config(TrainOptions {
            model: Some(ModelKind::Cnn),
            ..TrainOptions::default()
        });
        // LeNet-5 on 28x28: 156 + 2416 + 16*5*5*120+120 + 10164 + 850.
        assert_eq!(cnn.param_count(), 156 + 2416 + 48_120 + 10_164 + 850);
    }

    #[test]
    fn proc_files_are_read() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(mem_available(meminfo), Some(22_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max processes             94446                94446                processes \n";
        assert_eq!(max_processes(limits), Some(94_446));
        let unlimited =
            "Max processes             unlimited            unlimited            processes \n";
        assert_eq!(max_processes(unlimited), None);
        // This machine's files parse (where they exist).
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(Resources::of_this_machine().available_memory.is_some());
        }
    }

    #[test]
    fn too_many_workers_for_the_memory_are_refused_naming_flag_value_and_limit() {
        let res = Resources {
            available_memory: Some(1 << 30),
            max_processes: None,
        };
        let ok = config(TrainOptions {
            workers: Some(16),
            ..TrainOptions::default()
        });
        ok.check_workers(&res).unwrap();
        let big = config(TrainOptions {
            workers: Some(100_000),
            ..TrainOptions::default()
        });
        let e = big.check_workers(&res).unwrap_err().to_string();
        assert!(e.contains("--workers 100000"), "{e}");
        assert!(e.contains("MemAvailable") && e.contains("1.0 GiB"), "{e}");
        // Unknown memory is not checked.
        big.check_workers(&Resources::default()).unwrap();
    }

    #[test]
    fn too_many_workers_for_the_process_limit_are_refused() {
        let res = Resources {
            available_memory: None,
            max_processes: Some(500),
        };
        let c = config(TrainOptions {
            workers: Some(1000),
            ..TrainOptions::default()
        });
        let e = c.check_workers(&res).unwrap_err().to_string();
        assert!(
            e.contains("--workers 1000") && e.contains("RLIMIT_NPROC") && e.contains("500"),
            "{e}"
        );
    }

    #[test]
    fn local_nodes_are_capped_and_checked_against_memory_and_processes() {
        let c = config(TrainOptions::default());
        let roomy = Resources {
            available_memory: Some(64 << 30),
            max_processes: Some(100_000),
        };
        c.check_local_nodes(4, &roomy).unwrap();
        let e = c.check_local_nodes(2000, &roomy).unwrap_err().to_string();
        assert!(e.contains("--nodes 2000") && e.contains("256"), "{e}");
        let small = Resources {
            available_memory: Some(500 << 20),
            max_processes: None,
        };
        let e = c.check_local_nodes(64, &small).unwrap_err().to_string();
        assert!(
            e.contains("--nodes 64") && e.contains("MemAvailable"),
            "{e}"
        );
        let few = Resources {
            available_memory: None,
            max_processes: Some(200),
        };
        let e = c.check_local_nodes(64, &few).unwrap_err().to_string();
        assert!(
            e.contains("--nodes 64") && e.contains("RLIMIT_NPROC"),
            "{e}"
        );
    }
}
