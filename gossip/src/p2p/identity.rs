//! The node's keypair: its peer id, and therefore its rank order, must
//! survive restarts, so it lives in a file created on the first run.

use std::fs;
use std::io::Write;
use std::path::Path;

use libp2p::identity::Keypair;

use crate::CommError;

/// Loads the ed25519 keypair stored (protobuf encoding) in `path`, or
/// creates one there if the file does not exist. `None`: a fresh keypair that
/// is not kept.
pub fn load_or_create(path: Option<&Path>) -> Result<Keypair, CommError> {
    let Some(path) = path else {
        return Ok(Keypair::generate_ed25519());
    };
    match fs::read(path) {
        Ok(bytes) => Keypair::from_protobuf_encoding(&bytes).map_err(|e| {
            CommError::Config(format!(
                "identity file {}: not a protobuf-encoded libp2p keypair ({e}); \
                 delete it to create a new identity",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path),
        Err(e) => Err(CommError::Config(format!(
            "identity file {}: cannot read it: {e}",
            path.display()
        ))),
    }
}

/// Writes a new keypair atomically (temporary file, then rename) so that a
/// crash never leaves half a key behind; owner-only permissions on Unix.
fn create(path: &Path) -> Result<Keypair, CommError> {
    let fail = |what: &str, e: std::io::Error| {
        CommError::Config(format!(
            "identity file {}: cannot {what}: {e}",
            path.display()
        ))
    };
    let keypair = Keypair::generate_ed25519();
    let bytes = keypair
        .to_protobuf_encoding()
        .map_err(|e| CommError::Config(format!("encoding a new keypair: {e}")))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| fail("create its directory", e))?;
    }
    // A temporary name of our own, linked into place without replacing a
    // file another process created meanwhile (then that key is the one).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp).map_err(|e| fail("create it", e))?;
    file.write_all(&bytes).map_err(|e| fail("write it", e))?;
    file.sync_all().map_err(|e| fail("sync it", e))?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return load_or_create(Some(path));
        }
        Err(e) => return Err(fail("move it into place", e)),
    }
    tracing::info!(path = %path.display(), peer = %keypair.public().to_peer_id(), "created a new node identity");
    Ok(keypair)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("slowmo-id-{}", std::process::id()));
        let path = dir.join("node.key");
        let _ = fs::remove_file(&path);
        let first = load_or_create(Some(&path)).unwrap();
        let second = load_or_create(Some(&path)).unwrap();
        assert_eq!(first.public().to_peer_id(), second.public().to_peer_id());
        fs::write(&path, b"garbage").unwrap();
        let err = load_or_create(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("node.key"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
