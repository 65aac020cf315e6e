//! IDX files (MNIST, Fashion-MNIST): a big-endian header, then raw bytes.
//!
//! Images: magic `0x00000803` (unsigned bytes, 3 dimensions), count, rows,
//! columns, then `count * rows * columns` pixels. Labels: magic `0x00000801`,
//! count, then `count` bytes. Either file may be gzip-compressed; the reader
//! looks at the content, not the name. Pixels are scaled to [0, 1] and then
//! standardised with the dataset's published mean and standard deviation, so
//! that every model sees inputs of roughly unit scale.

use std::path::{Path, PathBuf};

use super::{DataError, Dataset, DatasetKind, Pixels, Split, find_file, read_maybe_gz};

/// Magic number of an unsigned-byte, 3-dimensional IDX file (images).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an unsigned-byte, 1-dimensional IDX file (labels).
pub const LABELS_MAGIC: u32 = 0x0000_0801;

/// Upper bound on a decompressed IDX file (the MNIST train images are 47 MB).
const MAX_FILE_BYTES: u64 = 1 << 30;

/// What differs between the IDX datasets.
#[derive(Debug, Clone, Copy)]
pub struct IdxSpec {
    pub kind: DatasetKind,
    /// Mean of the [0, 1]-scaled training pixels.
    pub mean: f32,
    /// Standard deviation of the [0, 1]-scaled training pixels.
    pub std: f32,
    pub classes: usize,
}

/// MNIST's usual normalisation constants.
pub const MNIST: IdxSpec = IdxSpec {
    kind: DatasetKind::Mnist,
    mean: 0.1307,
    std: 0.3081,
    classes: 10,
};

/// Fashion-MNIST's normalisation constants (measured on its training set).
pub const FASHION_MNIST: IdxSpec = IdxSpec {
    kind: DatasetKind::FashionMnist,
    mean: 0.2860,
    std: 0.3530,
    classes: 10,
};

/// Raw images of one IDX file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImages {
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    pub pixels: Vec<u8>,
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn check_len(path: &Path, expected: u64, got: u64) -> Result<(), DataError> {
    if expected == got {
        return Ok(());
    }
    Err(DataError::Truncated {
        path: path.to_path_buf(),
        what: if got < expected {
            "truncated"
        } else {
            "trailing bytes"
        },
        expected,
        got,
    })
}

/// Checks the first four bytes (a file shorter than that is truncated).
fn check_magic(path: &Path, bytes: &[u8], expected: u32) -> Result<(), DataError> {
    check_len(path, 4, bytes.len().min(4) as u64)?;
    let found = be_u32(bytes, 0);
    if found == expected {
        return Ok(());
    }
    Err(DataError::BadMagic {
        path: path.to_path_buf(),
        expected,
        found,
    })
}

/// Parses an IDX image file already in memory.
pub fn parse_images(path: &Path, bytes: &[u8]) -> Result<IdxImages, DataError> {
    check_magic(path, bytes, IMAGES_MAGIC)?;
    check_len(path, 16, bytes.len().min(16) as u64)?;
    let [count, rows, cols] = [4, 8, 12].map(|at| be_u32(bytes, at) as u64);
    let expected = count
        .saturating_mul(rows)
        .saturating_mul(cols)
        .saturating_add(16);
    check_len(path, expected, bytes.len() as u64)?;
    Ok(IdxImages {
        count: count as usize,
        rows: rows as usize,
        cols: cols as usize,
        pixels: bytes[16..].to_vec(),
    })
}

/// Parses an IDX label file already in memory, checking every label is below `classes`.
pub fn parse_labels(path: &Path, bytes: &[u8], classes: usize) -> Result<Vec<u32>, DataError> {
    check_magic(path, bytes, LABELS_MAGIC)?;
    check_len(path, 8, bytes.len().min(8) as u64)?;
    let count = be_u32(bytes, 4) as u64;
    check_len(path, 8 + count, bytes.len() as u64)?;
    bytes[8..]
        .iter()
        .enumerate()
        .map(|(index, &b)| {
            let label = u32::from(b);
            if (label as usize) < classes {
                Ok(label)
            } else {
                Err(DataError::LabelOutOfRange {
                    path: path.to_path_buf(),
                    index,
                    label,
                    classes,
                })
            }
        })
        .collect()
}

/// Reads one images/labels pair and normalises it.
pub fn read_split(
    images_path: &Path,
    labels_path: &Path,
    spec: IdxSpec,
) -> Result<(Split, usize, usize), DataError> {
    let images = parse_images(images_path, &read_maybe_gz(images_path, MAX_FILE_BYTES)?)?;
    let labels = parse_labels(
        labels_path,
        &read_maybe_gz(labels_path, MAX_FILE_BYTES)?,
        spec.classes,
    )?;
    if images.count != labels.len() {
        return Err(DataError::CountMismatch {
            images_path: images_path.to_path_buf(),
            images: images.count,
            labels_path: labels_path.to_path_buf(),
            labels: labels.len(),
        });
    }
    let scale = 1.0 / (255.0 * spec.std);
    let shift = spec.mean / spec.std;
    let mut pixels = Pixels::bytes(vec![Pixels::table(|p| f32::from(p) * scale - shift)], 1);
    pixels.extend_bytes(&images.pixels);
    Ok((
        Split {
            images: pixels,
            labels,
        },
        images.rows,
        images.cols,
    ))
}

/// Loads `train-*` and `t10k-*` from `dir` (each plain or `.gz`).
pub fn load_dir(dir: &Path, spec: IdxSpec) -> Result<Dataset, DataError> {
    let file = |name: &str| -> Result<PathBuf, DataError> { find_file(spec.kind, dir, name) };
    let train_images = file("train-images-idx3-ubyte")?;
    let train_labels = file("train-labels-idx1-ubyte")?;
    let test_images = file("t10k-images-idx3-ubyte")?;
    let test_labels = file("t10k-labels-idx1-ubyte")?;
    let (train, rows, cols) = read_split(&train_images, &train_labels, spec)?;
    let (test, test_rows, test_cols) = read_split(&test_images, &test_labels, spec)?;
    if (test_rows, test_cols) != (rows, cols) {
        return Err(DataError::ImageShape {
            path: test_images,
            expected_h: rows,
            expected_w: cols,
            found_h: test_rows,
            found_w: test_cols,
        });
    }
    Ok(Dataset {
        name: spec.kind.to_string(),
        train,
        test,
        channels: 1,
        height: rows,
        width: cols,
        classes: spec.classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn images_bytes(count: u32, rows: u32, cols: u32, fill: impl Fn(usize) -> u8) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [IMAGES_MAGIC, count, rows, cols] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.extend((0..(count * rows * cols) as usize).map(fill));
        b
    }

    fn labels_bytes(labels: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&LABELS_MAGIC.to_be_bytes());
        b.extend_from_slice(&(labels.len() as u32).to_be_bytes());
        b.extend_from_slice(labels);
        b
    }

    fn write(dir: &Path, name: &str, bytes: &[u8], gz: bool) {
        if gz {
            let f = std::fs::File::create(dir.join(format!("{name}.gz"))).unwrap();
            let mut e = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
            e.write_all(bytes).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    /// A 4x3 dataset: 5 train, 2 test samples.
    fn write_dataset(dir: &Path, gz: bool) {
        write(
            dir,
            "train-images-idx3-ubyte",
            &images_bytes(5, 4, 3, |i| (i * 7 % 256) as u8),
            gz,
        );
        write(
            dir,
            "train-labels-idx1-ubyte",
            &labels_bytes(&[0, 9, 3, 3, 1]),
            gz,
        );
        write(
            dir,
            "t10k-images-idx3-ubyte",
            &images_bytes(2, 4, 3, |_| 255),
            gz,
        );
        write(dir, "t10k-labels-idx1-ubyte", &labels_bytes(&[2, 5]), gz);
    }

    #[test]
    fn reads_plain_and_gzip_identically() {
        let plain = tempfile::tempdir().unwrap();
        let gz = tempfile::tempdir().unwrap();
        write_dataset(plain.path(), false);
        write_dataset(gz.path(), true);
        let a = load_dir(plain.path(), MNIST).unwrap();
        let b = load_dir(gz.path(), MNIST).unwrap();
        assert_eq!(a, b);
        assert_eq!((a.channels, a.height, a.width, a.classes), (1, 4, 3, 10));
        assert_eq!(a.train.labels, vec![0, 9, 3, 3, 1]);
        assert_eq!(a.test.labels, vec![2, 5]);
        assert_eq!(a.train.images.len(), 5 * 12);
        // pixel 1 of the train set is 7: (7/255 - mean) / std
        let want = (7.0 / 255.0 - MNIST.mean) / MNIST.std;
        assert!((a.train.images.to_vec()[1] - want).abs() < 1e-6);
        let white = (1.0 - MNIST.mean) / MNIST.std;
        let test = a.test.images.to_vec();
        assert!(test.iter().all(|&x| (x - white).abs() < 1e-5));
    }

    #[test]
    fn bad_magic_reports_expected_and_found() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), false);
        // swap: a label file where the images should be
        write(
            dir.path(),
            "train-images-idx3-ubyte",
            &labels_bytes(&[1, 2]),
            false,
        );
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                DataError::BadMagic {
                    expected: IMAGES_MAGIC,
                    found: LABELS_MAGIC,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("train-images-idx3-ubyte") && msg.contains("0x00000803"),
            "{msg}"
        );
    }

    #[test]
    fn truncated_and_trailing_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), true);
        let mut short = images_bytes(5, 4, 3, |_| 0);
        short.truncate(16 + 50);
        write(dir.path(), "train-images-idx3-ubyte", &short, true);
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::Truncated {
                    expected: 76,
                    got: 66,
                    what: "truncated",
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("expected 76 bytes, got 66"),
            "{err}"
        );

        // header itself cut short
        write(
            dir.path(),
            "train-images-idx3-ubyte",
            &[0, 0, 8, 3, 0, 0],
            true,
        );
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::Truncated {
                    expected: 16,
                    got: 6,
                    ..
                }
            ),
            "{err}"
        );

        let mut long = labels_bytes(&[1, 2]);
        long.push(0);
        write(
            dir.path(),
            "train-images-idx3-ubyte",
            &images_bytes(5, 4, 3, |_| 0),
            true,
        );
        write(dir.path(), "t10k-labels-idx1-ubyte", &long, true);
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::Truncated {
                    what: "trailing bytes",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn label_out_of_range_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), false);
        write(
            dir.path(),
            "train-labels-idx1-ubyte",
            &labels_bytes(&[0, 1, 10, 3, 1]),
            false,
        );
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::LabelOutOfRange {
                    index: 2,
                    label: 10,
                    classes: 10,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn count_mismatch_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), false);
        write(
            dir.path(),
            "t10k-labels-idx1-ubyte",
            &labels_bytes(&[1, 2, 3]),
            false,
        );
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::CountMismatch {
                    images: 2,
                    labels: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("t10k-labels-idx1-ubyte"), "{err}");
    }

    #[test]
    fn test_images_of_another_size_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), false);
        write(
            dir.path(),
            "t10k-images-idx3-ubyte",
            &images_bytes(2, 3, 3, |_| 0),
            false,
        );
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::ImageShape {
                    found_h: 3,
                    expected_h: 4,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn missing_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), false);
        std::fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte")).unwrap();
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(matches!(err, DataError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("t10k-labels-idx1-ubyte"), "{err}");
    }

    #[test]
    fn corrupt_gzip_is_an_io_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), false);
        std::fs::write(
            dir.path().join("train-images-idx3-ubyte"),
            [0x1f, 0x8b, 1, 2, 3],
        )
        .unwrap();
        let err = load_dir(dir.path(), MNIST).unwrap_err();
        assert!(matches!(err, DataError::Io { .. }), "{err}");
        assert!(err.to_string().contains("train-images-idx3-ubyte"), "{err}");
    }
}
