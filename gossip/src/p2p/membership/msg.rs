//! The messages of `/slowmo/membership/1` and their framing: a `u32 LE`
//! length, then CBOR.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use serde::{Deserialize, Serialize};

use crate::p2p::config::RunIdentity;

/// Largest membership message we read.
const MAX_MESSAGE: u32 = 1 << 20;
/// Time for one hello exchange.
pub(super) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// A member as other peers should dial it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemberInfo {
    pub peer: String,
    pub addrs: Vec<String>,
}

/// A view a peer has started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ViewInfo {
    pub number: u64,
    pub members: Vec<String>,
    /// The process instance of each member when it entered the view: a
    /// node that finds its peer id there with another instance is a
    /// restart and must join again.
    #[serde(default)]
    pub instances: Vec<u64>,
}

/// Who we are and what we know.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub version: u16,
    pub nodes: u64,
    pub identity: RunIdentity,
    pub peer: String,
    pub addrs: Vec<String>,
    pub members: Vec<MemberInfo>,
    pub proposal: Option<Vec<String>>,
    pub view: Option<ViewInfo>,
    /// The settings behind the config hash, by name.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Digest of the admission policy (every node of a run has the same).
    #[serde(default)]
    pub admission: String,
    /// Random per process: two instances behind one peer id are two
    /// processes sharing one identity.
    #[serde(default)]
    pub instance: u64,
    /// The sender's data-lane addresses (`IP:port`, TCP): when its process
    /// is gone they refuse connections, which tells a view change not to
    /// wait for it (QUIC sees nothing of a killed process until the peer
    /// timeout). Empty without a lane.
    #[serde(default)]
    pub lane: Vec<String>,
}

/// Why an admitted peer was refused: the field that differs and, for the
/// config hash, the names of the settings that differ. No values: the
/// refuser's log has them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Refusal {
    pub field: String,
    pub settings: Vec<String>,
}

/// Field of the refusal sent to a peer id seen from two processes.
pub(crate) const DUPLICATE: &str = "duplicated identity";

/// A refusal as this node records it: the field and the log text.
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    pub field: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)] // one per exchange
pub(crate) enum Reply {
    Welcome(Hello),
    Refused(Refusal),
}

/// Writes one membership message: `u32 LE length`, then its CBOR.
pub(crate) async fn write_msg<T: Serialize, W: AsyncWrite + Unpin>(
    s: &mut W,
    msg: &T,
) -> std::io::Result<()> {
    let body = cbor4ii::serde::to_vec(Vec::new(), msg).map_err(std::io::Error::other)?;
    s.write_all(&(body.len() as u32).to_le_bytes()).await?;
    s.write_all(&body).await?;
    s.flush().await
}

/// Reads one membership message (the decoder of every hello and reply).
pub(crate) async fn read_msg<T: serde::de::DeserializeOwned, R: AsyncRead + Unpin>(
    s: &mut R,
) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len);
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!(
            "membership message of {len} bytes exceeds {MAX_MESSAGE}"
        )));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await?;
    cbor4ii::serde::from_slice(&body)
        .map_err(|e| std::io::Error::other(format!("malformed membership message: {e}")))
}
