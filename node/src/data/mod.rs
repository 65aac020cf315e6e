//! Datasets: loading, partitioning across workers, and mini-batching.
//!
//! Every dataset is held in memory as normalised images in NCHW order (one
//! flat store per split: the bytes of image files with a table per channel,
//! f32 values for synthetic data, see [`Pixels`]) plus `u32` labels. The
//! loop only ever sees a [`Split`] and index shards of it, so a worker's
//! data is a list of indices ([`shard_indices`]) walked by a seeded
//! [`Batcher`].
//!
//! - [`DatasetKind::Synthetic`] (the default) needs no files: it is generated
//!   from the seed in well under a second, see [`synthetic`].
//! - MNIST and Fashion-MNIST are read from IDX files, gzip-compressed or not
//!   ([`idx`]); Debian ships Fashion-MNIST (`apt-get install
//!   dataset-fashion-mnist`) under [`DEBIAN_FASHION_MNIST_DIR`].
//! - CIFAR-10 is read from its binary batches ([`cifar`]).
//! - Text (`--dataset text:PATH`) is byte-level tokens in windows of the
//!   transformer's context ([`text`]).
//!
//! Bad files never panic: every failure is a [`DataError`] that names the file
//! and what was wrong with it.

pub mod batcher;
pub mod cifar;
pub mod idx;
pub mod partition;
pub mod pixels;
pub mod samples;
pub mod synthetic;
pub mod text;

use std::path::{Path, PathBuf};

pub use batcher::Batcher;
pub use partition::{Partition, shard_indices};
pub use pixels::Pixels;
pub use samples::{Head, Samples, TrainData};

/// Where Debian's `dataset-fashion-mnist` package puts the four gzip IDX files.
pub const DEBIAN_FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

pub use slowmo_runspec::DatasetKind;

/// One split (train or test): images in NCHW order, flattened, normalised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    /// `len() * channels * height * width` values, sample after sample.
    pub images: Pixels,
    /// One class index per sample.
    pub labels: Vec<u32>,
}

impl Split {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the split holds no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values per sample (`channels * height * width`), 0 for an empty split.
    pub fn sample_len(&self) -> usize {
        self.images
            .len()
            .checked_div(self.labels.len())
            .unwrap_or(0)
    }

    /// The pixels of sample `i`, or `None` when `i` is out of range.
    pub fn image(&self, i: usize) -> Option<std::borrow::Cow<'_, [f32]>> {
        let n = self.sample_len();
        self.images.get(i * n, (i + 1) * n)
    }

    /// The samples `indices`, in that order, in a split of the same kind
    /// of store.
    ///
    /// # Panics
    /// When an index is out of range.
    pub fn select(&self, indices: impl IntoIterator<Item = usize> + Clone) -> Split {
        let n = self.sample_len();
        Split {
            images: self
                .images
                .gather(indices.clone().into_iter().map(|i| i * n..(i + 1) * n)),
            labels: indices.into_iter().map(|i| self.labels[i]).collect(),
        }
    }

    /// Appends the pixels of sample `i` to `out`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn image_into(&self, i: usize, sample_len: usize, out: &mut Vec<f32>) {
        self.images
            .extend_into(i * sample_len, (i + 1) * sample_len, out);
    }
}

/// A loaded dataset: both splits plus the image geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Human-readable name (the [`DatasetKind`] name).
    pub name: String,
    /// Training split.
    pub train: Split,
    /// Held-out split used for evaluation.
    pub test: Split,
    /// Colour channels per image.
    pub channels: usize,
    /// Image height in pixels.
    pub height: usize,
    /// Image width in pixels.
    pub width: usize,
    /// Number of classes; every label is below this.
    pub classes: usize,
}

impl Dataset {
    /// Values per sample: `channels * height * width`.
    pub fn sample_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// A dataset from the caller's own samples (a custom workload): each
    /// split is `(values, labels)`, `sample_len` values per sample, sample
    /// after sample, and one label below `classes` per sample. Every length
    /// and label is checked; the error names the split and what was wrong.
    pub fn from_samples(
        name: &str,
        sample_len: usize,
        classes: usize,
        train: (Vec<f32>, Vec<u32>),
        test: (Vec<f32>, Vec<u32>),
    ) -> Result<Dataset, DataError> {
        let bad = |why: String| DataError::Invalid {
            dataset: name.to_string(),
            why,
        };
        if sample_len == 0 || classes == 0 {
            return Err(bad(format!(
                "samples of {sample_len} values in {classes} classes: both must be positive"
            )));
        }
        let mut splits = Vec::new();
        for (which, (values, labels)) in [("train", train), ("test", test)] {
            if labels.is_empty() {
                return Err(bad(format!("the {which} split holds no samples")));
            }
            if Some(values.len()) != labels.len().checked_mul(sample_len) {
                return Err(bad(format!(
                    "the {which} split has {} labels and {} values, not {sample_len} values per label",
                    labels.len(),
                    values.len()
                )));
            }
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(bad(format!(
                    "value {i} of the {which} split is {}",
                    values[i]
                )));
            }
            if let Some(i) = labels.iter().position(|&l| l as usize >= classes) {
                return Err(bad(format!(
                    "label {} of sample {i} of the {which} split is not below {classes} classes",
                    labels[i]
                )));
            }
            splits.push(Split {
                images: Pixels::Values(values),
                labels,
            });
        }
        let test = splits.pop().expect("two splits");
        let train = splits.pop().expect("two splits");
        Ok(Dataset {
            name: name.to_string(),
            train,
            test,
            channels: 1,
            height: 1,
            width: sample_len,
            classes,
        })
    }
}

/// Everything that can go wrong while loading or splitting data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A dataset file does not exist.
    #[error("{dataset}: file {file} not found in {}{hint}", dir.display())]
    Missing {
        dataset: DatasetKind,
        file: String,
        dir: PathBuf,
        /// How to get the file (begins with "; ", or is empty).
        hint: String,
    },
    /// No data directory was given and the dataset has no default location.
    #[error("{dataset}: no data directory; pass --data-dir pointing at the {dataset} files")]
    NoDataDir { dataset: DatasetKind },
    /// Reading (or decompressing) a file failed.
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file starts with the wrong magic number.
    #[error("{}: bad magic number: expected {expected:#010x}, found {found:#010x}", path.display())]
    BadMagic {
        path: PathBuf,
        expected: u32,
        found: u32,
    },
    /// A file is shorter (or longer) than its header says.
    #[error("{}: {what}: expected {expected} bytes, got {got}", path.display())]
    Truncated {
        path: PathBuf,
        /// "truncated" or "trailing bytes".
        what: &'static str,
        expected: u64,
        got: u64,
    },
    /// A label is not a valid class index.
    #[error("{}: label {label} of sample {index} is out of range (expected < {classes})", path.display())]
    LabelOutOfRange {
        path: PathBuf,
        index: usize,
        label: u32,
        classes: usize,
    },
    /// The image and label files disagree on the number of samples.
    #[error("{} holds {images} images but {} holds {labels} labels", images_path.display(), labels_path.display())]
    CountMismatch {
        images_path: PathBuf,
        images: usize,
        labels_path: PathBuf,
        labels: usize,
    },
    /// Image dimensions differ from what the dataset needs.
    #[error("{}: images are {found_h}x{found_w}, expected {expected_h}x{expected_w}", path.display())]
    ImageShape {
        path: PathBuf,
        expected_h: usize,
        expected_w: usize,
        found_h: usize,
        found_w: usize,
    },
    /// A text file (or a folder's only content) holds nothing to train on.
    #[error("{}: {what}; text data needs at least one non-empty file", path.display())]
    EmptyText { path: PathBuf, what: &'static str },
    /// The text is shorter than a training and a held-out window.
    #[error(
        "{}: {bytes} bytes of text, need at least {need} (one window of context {context} + 1 \
         tokens to train on and one held out); give more text or a smaller --context",
        path.display()
    )]
    TextTooShort {
        path: PathBuf,
        bytes: usize,
        need: usize,
        context: usize,
    },
    /// The text is larger than the loader takes.
    #[error("{}: {bytes} bytes of text, above the limit of {limit}", path.display())]
    TextTooLarge {
        path: PathBuf,
        bytes: u64,
        limit: u64,
    },
    /// Samples a caller gave ([`Dataset::from_samples`]) do not fit.
    #[error("dataset {dataset}: {why}")]
    Invalid { dataset: String, why: String },
    /// The data cannot be split as asked.
    #[error("cannot partition {samples} samples across {workers} workers: {reason}")]
    Unpartitionable {
        samples: usize,
        workers: usize,
        reason: String,
    },
}

/// Where a dataset lives when `--data-dir` is not given: the Debian package
/// directory for Fashion-MNIST, nothing for the others (synthetic needs no
/// files; MNIST and CIFAR-10 have no standard location).
pub fn default_data_dir(kind: DatasetKind) -> Option<PathBuf> {
    match kind {
        DatasetKind::FashionMnist => Some(PathBuf::from(DEBIAN_FASHION_MNIST_DIR)),
        DatasetKind::Synthetic | DatasetKind::Mnist | DatasetKind::Cifar10 | DatasetKind::Text => {
            None
        }
    }
}

/// Loads (or, for synthetic data, generates from `seed`) a dataset.
///
/// `data_dir` overrides [`default_data_dir`]; it is ignored for synthetic data.
/// The file datasets ignore `seed`: their splits are fixed by the files.
/// Text is cut for the default transformer context; [`text::load`] takes
/// another.
pub fn load(kind: DatasetKind, data_dir: Option<&Path>, seed: u64) -> Result<Dataset, DataError> {
    if kind == DatasetKind::Synthetic {
        return Ok(synthetic::generate(
            &synthetic::SyntheticConfig::default(),
            seed,
        ));
    }
    let dir = match data_dir {
        Some(d) => d.to_path_buf(),
        None => default_data_dir(kind).ok_or(DataError::NoDataDir { dataset: kind })?,
    };
    match kind {
        DatasetKind::FashionMnist => idx::load_dir(&dir, idx::FASHION_MNIST),
        DatasetKind::Mnist => idx::load_dir(&dir, idx::MNIST),
        DatasetKind::Cifar10 => cifar::load_dir(&dir),
        DatasetKind::Text => text::load(&dir, slowmo_runspec::TransformerShape::default().context),
        DatasetKind::Synthetic => unreachable!("handled above"),
    }
}

/// Reads a whole file, transparently gunzipping it when it starts with the
/// gzip magic bytes (so `foo.gz` and a plain `foo` both work whatever their
/// names say). `limit` caps the decompressed size so a hostile file cannot
/// exhaust memory.
pub(crate) fn read_maybe_gz(path: &Path, limit: u64) -> Result<Vec<u8>, DataError> {
    use std::io::Read;
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(raw.as_slice())
            .take(limit)
            .read_to_end(&mut out)
            .map_err(io)?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Finds `name` or `name.gz` in `dir`, or explains which names were tried.
pub(crate) fn find_file(
    dataset: DatasetKind,
    dir: &Path,
    name: &str,
) -> Result<PathBuf, DataError> {
    for candidate in [name.to_string(), format!("{name}.gz")] {
        let p = dir.join(&candidate);
        if p.is_file() {
            return Ok(p);
        }
    }
    let hint = match dataset {
        DatasetKind::FashionMnist => {
            "; install it with `apt-get install dataset-fashion-mnist` or pass --data-dir".into()
        }
        _ => "; pass --data-dir pointing at the directory that holds it".into(),
    };
    Err(DataError::Missing {
        dataset,
        file: format!("{name} (or {name}.gz)"),
        dir: dir.to_path_buf(),
        hint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_geometry() {
        let s = Split {
            images: (0..12).map(|x| x as f32).collect::<Vec<_>>().into(),
            labels: vec![0, 1, 2],
        };
        assert_eq!(s.len(), 3);
        assert_eq!(s.sample_len(), 4);
        assert_eq!(s.image(2).unwrap().as_ref(), &[8.0, 9.0, 10.0, 11.0]);
        assert!(s.image(3).is_none());
        assert_eq!(Split::default().sample_len(), 0);
    }

    #[test]
    fn missing_fashion_mnist_names_file_dir_and_apt() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(DatasetKind::FashionMnist, Some(dir.path()), 0).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::Missing { .. }));
        assert!(msg.contains("train-images-idx3-ubyte"), "{msg}");
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(
            msg.contains("apt-get install dataset-fashion-mnist"),
            "{msg}"
        );
        assert!(msg.contains("--data-dir"), "{msg}");
    }

    #[test]
    fn mnist_without_dir_asks_for_data_dir() {
        let err = load(DatasetKind::Mnist, None, 0).unwrap_err();
        assert!(matches!(err, DataError::NoDataDir { .. }));
        assert!(err.to_string().contains("--data-dir"));
    }

    /// Runs only where the Debian package is installed; checks the real files
    /// parse and normalise to roughly zero mean, unit variance.
    #[test]
    #[ignore = "needs dataset-fashion-mnist installed; takes ~1 s"]
    fn debian_fashion_mnist_loads() {
        let d = load(DatasetKind::FashionMnist, None, 0).unwrap();
        assert_eq!((d.train.len(), d.test.len()), (60_000, 10_000));
        assert_eq!((d.channels, d.height, d.width, d.classes), (1, 28, 28, 10));
        let values = d.train.images.to_vec();
        let n = values.len() as f64;
        let mean = values.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&x| (x as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(
            mean.abs() < 0.01 && (var.sqrt() - 1.0).abs() < 0.01,
            "{mean} {var}"
        );
    }
}
