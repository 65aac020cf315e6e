//! CIFAR-10 binary batches (`cifar-10-batches-bin`).
//!
//! Each file is a sequence of 3073-byte records: one label byte, then a 32x32
//! image as 1024 red, 1024 green and 1024 blue bytes (row-major), which is
//! already the CHW order the models use. Training data is `data_batch_1.bin`
//! to `data_batch_5.bin`, test data `test_batch.bin` (plain or `.gz`). The
//! directory may be the one holding the files or its parent, as unpacked from
//! the official archive.

use std::path::{Path, PathBuf};

use super::{DataError, Dataset, DatasetKind, Pixels, Split, find_file, read_maybe_gz};

/// Image side length.
pub const SIDE: usize = 32;
/// Colour channels.
pub const CHANNELS: usize = 3;
/// Bytes per record: label + pixels.
pub const RECORD: usize = 1 + CHANNELS * SIDE * SIDE;
/// Per-channel mean of the [0, 1]-scaled training pixels.
pub const MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// Per-channel standard deviation of the [0, 1]-scaled training pixels.
pub const STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
const CLASSES: usize = 10;
/// Upper bound on one decompressed batch file (a real one is 30 MB).
const MAX_FILE_BYTES: u64 = 1 << 30;

/// Appends the records of one batch file to `split` (made by
/// [`empty_split`]).
pub fn read_batch(path: &Path, split: &mut Split) -> Result<(), DataError> {
    let bytes = read_maybe_gz(path, MAX_FILE_BYTES)?;
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        let records = bytes.len().div_ceil(RECORD).max(1);
        return Err(DataError::Truncated {
            path: path.to_path_buf(),
            what: "truncated (not a whole number of 3073-byte records)",
            expected: (records * RECORD) as u64,
            got: bytes.len() as u64,
        });
    }
    for (index, record) in bytes.chunks_exact(RECORD).enumerate() {
        let label = u32::from(record[0]);
        if label as usize >= CLASSES {
            return Err(DataError::LabelOutOfRange {
                path: path.to_path_buf(),
                index,
                label,
                classes: CLASSES,
            });
        }
        split.labels.push(label);
        split.images.extend_bytes(&record[1..]);
    }
    Ok(())
}

/// An empty split whose pixels are CIFAR bytes, normalised per channel.
pub fn empty_split() -> Split {
    let tables = (0..CHANNELS)
        .map(|c| {
            let scale = 1.0 / (255.0 * STD[c]);
            let shift = MEAN[c] / STD[c];
            Pixels::table(|p| f32::from(p) * scale - shift)
        })
        .collect();
    Split {
        images: Pixels::bytes(tables, SIDE * SIDE),
        labels: Vec::new(),
    }
}

/// Loads the five training batches and the test batch from `dir` (or from
/// `dir/cifar-10-batches-bin`).
pub fn load_dir(dir: &Path) -> Result<Dataset, DataError> {
    let nested = dir.join("cifar-10-batches-bin");
    let dir: PathBuf = if !dir.join("test_batch.bin").exists()
        && !dir.join("test_batch.bin.gz").exists()
        && nested.is_dir()
    {
        nested
    } else {
        dir.to_path_buf()
    };
    let kind = DatasetKind::Cifar10;
    let mut train = empty_split();
    for i in 1..=5 {
        read_batch(
            &find_file(kind, &dir, &format!("data_batch_{i}.bin"))?,
            &mut train,
        )?;
    }
    let mut test = empty_split();
    read_batch(&find_file(kind, &dir, "test_batch.bin")?, &mut test)?;
    Ok(Dataset {
        name: kind.to_string(),
        train,
        test,
        channels: CHANNELS,
        height: SIDE,
        width: SIDE,
        classes: CLASSES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(labels: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for (i, &l) in labels.iter().enumerate() {
            b.push(l);
            b.extend((0..RECORD - 1).map(|p| ((p / 1024) * 100 + i) as u8));
        }
        b
    }

    fn write_all(dir: &Path) {
        for i in 1..=5 {
            std::fs::write(
                dir.join(format!("data_batch_{i}.bin")),
                batch(&[i as u8, 0]),
            )
            .unwrap();
        }
        std::fs::write(dir.join("test_batch.bin"), batch(&[9])).unwrap();
    }

    #[test]
    fn reads_batches_in_chw_order_with_per_channel_normalisation() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("cifar-10-batches-bin");
        std::fs::create_dir(&dir).unwrap();
        write_all(&dir);
        // the parent directory works too
        let d = load_dir(root.path()).unwrap();
        assert_eq!(d.train.labels, vec![1, 0, 2, 0, 3, 0, 4, 0, 5, 0]);
        assert_eq!(d.test.labels, vec![9]);
        assert_eq!(d.sample_len(), 3072);
        assert_eq!(d.train.sample_len(), 3072);
        let img = d.test.image(0).unwrap();
        for c in 0..3 {
            let want = ((c * 100) as f32 / 255.0 - MEAN[c]) / STD[c];
            assert!((img[c * 1024] - want).abs() < 1e-5);
            assert!((img[c * 1024 + 1023] - want).abs() < 1e-5);
        }
    }

    #[test]
    fn malformed_batches_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path());
        let mut b = batch(&[1, 2]);
        b.truncate(RECORD + 10);
        std::fs::write(dir.path().join("data_batch_3.bin"), &b).unwrap();
        let err = load_dir(dir.path()).unwrap_err();
        assert!(
            matches!(err, DataError::Truncated { expected, got, .. } if expected == 2 * RECORD as u64 && got == RECORD as u64 + 10),
            "{err}"
        );
        assert!(err.to_string().contains("data_batch_3.bin"), "{err}");

        std::fs::write(dir.path().join("data_batch_3.bin"), batch(&[1, 10])).unwrap();
        let err = load_dir(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::LabelOutOfRange {
                    index: 1,
                    label: 10,
                    ..
                }
            ),
            "{err}"
        );

        std::fs::remove_file(dir.path().join("data_batch_3.bin")).unwrap();
        let err = load_dir(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("data_batch_3.bin"), "{err}");
    }
}
