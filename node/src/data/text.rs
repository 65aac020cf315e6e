//! Byte-level text for the transformer language model (`--dataset
//! text:PATH`).
//!
//! The path is a file, or a folder whose regular files (not its subfolders
//! or symbolic links, which may repeat a file) are read in name order and
//! joined. Every byte is a token
//! (vocabulary 256), so any file is valid text.
//!
//! How text fits the [`Split`] design: the token stream is cut into
//! windows of `context + 1` tokens that overlap by one (window `i` starts at
//! token `i * context`), so every token but the first is a target exactly
//! once per epoch. A window is a sample: `context + 1` values (the token ids
//! as `f32`, exact below 2^24), with `channels = height = 1`, `width =
//! context + 1` and 256 classes; its label is its last token, which the
//! model does not read (it takes its targets from the sample). The
//! [`super::Batcher`] and evaluation then work unchanged. The last tenth of
//! the stream (at least one window) is the held-out split (`test`), the rest
//! trains; with the `contiguous` partition, the default for text, each
//! worker's shard is one contiguous stretch of the training stream, whose
//! windows its batcher visits in a seeded shuffled order.

use std::path::{Path, PathBuf};

use super::{DataError, Dataset, Pixels, Split};

/// Tokens of the byte-level vocabulary.
pub const VOCAB: usize = 256;

/// The largest text read (all files together), so that a path given by
/// mistake cannot exhaust memory: a sample holds 4 bytes per text byte.
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// Reads the text at `path` and cuts it into training and held-out
/// windows of `context + 1` tokens (see the module docs).
///
/// Errors name the path: unreadable, empty (a file, or a folder without a
/// non-empty file), too large, or too short for one window in each split.
pub fn load(path: &Path, context: usize) -> Result<Dataset, DataError> {
    let bytes = read_text(path)?;
    let window = context + 1;
    // held out: the last tenth, at least one window; training: the rest,
    // also at least one window
    let need = 2 * window;
    if bytes.len() < need {
        return Err(DataError::TextTooShort {
            path: path.to_path_buf(),
            bytes: bytes.len(),
            need,
            context,
        });
    }
    let held_out = (bytes.len() / 10).max(window);
    let (train, test) = bytes.split_at(bytes.len() - held_out);
    Ok(Dataset {
        name: format!("text:{}", path.display()),
        train: windows(train, context),
        test: windows(test, context),
        channels: 1,
        height: 1,
        width: window,
        classes: VOCAB,
    })
}

/// The windows of `tokens` (at least `context + 1` of them): `context + 1`
/// tokens each, starting every `context` tokens.
fn windows(tokens: &[u8], context: usize) -> Split {
    let n = (tokens.len() - 1) / context;
    // A token is its byte: one byte per value, read as its number.
    let mut images = Pixels::bytes(vec![Pixels::table(f32::from)], 1);
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let w = &tokens[i * context..=(i + 1) * context];
        images.extend_bytes(w);
        labels.push(u32::from(w[context]));
    }
    Split { images, labels }
}

/// The bytes of a file, or of a folder's regular files in name order.
fn read_text(path: &Path) -> Result<Vec<u8>, DataError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| DataError::Io { path: p, source }
    };
    let meta = std::fs::metadata(path).map_err(io(path))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io(path))? {
            let entry = entry.map_err(io(path))?;
            // regular files only: a link may repeat a file of the folder
            if entry.file_type().map_err(io(&entry.path()))?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(DataError::EmptyText {
                path: path.to_path_buf(),
                what: "holds no files",
            });
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut total = 0u64;
    for f in &files {
        total = total.saturating_add(std::fs::metadata(f).map_err(io(f))?.len());
    }
    if total > MAX_TEXT_BYTES {
        return Err(DataError::TextTooLarge {
            path: path.to_path_buf(),
            bytes: total,
            limit: MAX_TEXT_BYTES,
        });
    }
    let mut bytes = Vec::with_capacity(total as usize);
    for f in &files {
        let text = std::fs::read(f).map_err(io(f))?;
        if text.is_empty() {
            return Err(DataError::EmptyText {
                path: f.clone(),
                what: "is empty",
            });
        }
        bytes.extend_from_slice(&text);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_overlap_by_one_and_split_off_the_last_tenth() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        let text: Vec<u8> = (0..200u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        let d = load(&path, 4).unwrap();
        assert_eq!((d.channels, d.height, d.width, d.classes), (1, 1, 5, 256));
        // 20 held out (a tenth), 180 train: (180 - 1) / 4 = 44 windows
        assert_eq!(d.train.len(), 44);
        assert_eq!(
            d.train.image(1).unwrap().as_ref(),
            &[4.0, 5.0, 6.0, 7.0, 8.0]
        );
        assert_eq!(d.train.labels[1], 8);
        assert_eq!(d.test.len(), 4);
        assert_eq!(d.test.image(0).unwrap()[0], 180.0);
    }

    #[test]
    fn a_folder_is_its_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), [2u8; 30]).unwrap();
        std::fs::write(dir.path().join("a.txt"), [1u8; 30]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("a.txt"), dir.path().join("c.txt")).unwrap();
        let d = load(dir.path(), 4).unwrap();
        assert_eq!(d.train.image(0).unwrap().as_ref(), &[1.0; 5]);
        assert_eq!(d.test.image(0).unwrap().as_ref(), &[2.0; 5]);
    }

    #[test]
    fn bad_text_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, b"").unwrap();
        let short = dir.path().join("short.txt");
        std::fs::write(&short, b"0123456789").unwrap();
        let missing = dir.path().join("missing.txt");
        let folder = dir.path().join("nothing");
        std::fs::create_dir(&folder).unwrap();
        for (path, what) in [
            (&empty, "is empty"),
            (&short, "10 bytes"),
            (&missing, "No such file"),
            (&folder, "holds no files"),
        ] {
            let msg = load(path, 8).unwrap_err().to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(what), "{msg}");
        }
        // an empty file inside a folder is named too
        std::fs::write(folder.join("a.txt"), [b'x'; 100]).unwrap();
        std::fs::write(folder.join("b.txt"), b"").unwrap();
        let msg = load(&folder, 8).unwrap_err().to_string();
        assert!(msg.contains("b.txt") && msg.contains("is empty"), "{msg}");
    }
}
