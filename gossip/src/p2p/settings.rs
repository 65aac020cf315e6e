//! The run's settings for a joiner that holds a join ticket
//! (`/slowmo/settings/1`).
//!
//! A ticket carries the run id and the config hash, the SHA-256 of the
//! settings text. A joiner without the settings asks a member for them
//! over this protocol, presenting both; the member answers with the text
//! only when both match its own run, so a stranger learns nothing it did
//! not bring. The joiner accepts the text only if its SHA-256 is the
//! ticket's hash, so the member it asked cannot change the run.
//!
//! Request: `u16` version, then the run id and the hash, each a `u16`
//! length and its bytes. Answer: one status byte (`0` the settings, `1` a
//! refusal), a `u32` length and the text (the settings) or the reason
//! (UTF-8). Every length is bounded before anything is read into memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::{Multiaddr, PeerId, Stream, StreamProtocol};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::addrs::parse_addrs;
use super::behaviour::{self, NetEvent};
use super::command::SwarmCmd;
use super::config::P2pConfig;
use super::identity;
use super::nat::NatSetup;
use super::reach::Reach;
use super::state::Shared;

/// The protocol id; its major version changes with the message layout.
pub const SETTINGS_PROTOCOL: &str = "/slowmo/settings/1";
/// The request layout's version.
const SETTINGS_VERSION: u16 = 1;
/// The largest settings text a joiner reads.
pub const MAX_SETTINGS_BYTES: u32 = 64 * 1024;
/// The largest run id or hash in a request.
const MAX_FIELD_BYTES: u16 = 1024;
/// How long one request may take once the stream is open.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

const OK: u8 = 0;
const REFUSED: u8 = 1;

/// Why the settings could not be had from a ticket's peers.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// An address of the ticket is not a multiaddr ending in `/p2p/<id>`.
    #[error("the ticket's address `{0}` does not end in /p2p/<peer id>")]
    Address(String),
    /// The network could not be set up.
    #[error("{0}")]
    Network(String),
    /// No peer of the ticket could be reached in time.
    #[error(
        "no peer of the ticket answered within {waited:?} ({tried}): is the run's first node running, and its TCP or QUIC listen port open?"
    )]
    Unreachable { waited: Duration, tried: String },
    /// The peer refused: the run id or hash is not its run's.
    #[error("peer {peer} refused the ticket: {reason}")]
    Refused { peer: String, reason: String },
    /// The peer's settings are not the ones the ticket names.
    #[error(
        "peer {peer} sent settings whose SHA-256 is {got}, not the ticket's config hash {expected}"
    )]
    HashMismatch {
        peer: String,
        got: String,
        expected: String,
    },
    /// The peer broke the protocol (a length over the bound, bad UTF-8, a
    /// stream that ended early).
    #[error("peer {peer} answered badly: {why}")]
    Protocol { peer: String, why: String },
}

/// The SHA-256 of a settings text, hex: what a config hash is.
pub fn settings_hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Serves the run's settings for the life of the node (when the
/// configuration holds them).
pub(crate) fn spawn_acceptor(
    shared: &Arc<Shared>,
    control: &mut libp2p_stream::Control,
) -> Result<(), String> {
    if shared.cfg.settings_text.is_empty() {
        return Ok(());
    }
    let mut incoming = control
        .accept(StreamProtocol::new(SETTINGS_PROTOCOL))
        .map_err(|e| format!("{SETTINGS_PROTOCOL}: {e}"))?;
    let shared = shared.clone();
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            let shared = shared.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(EXCHANGE_TIMEOUT, answer(&shared, stream)).await {
                    Ok(Ok(served)) => {
                        tracing::info!(%peer, served, "settings asked for by {peer} with a ticket")
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "settings request from {peer}: {e}"),
                    Err(_) => tracing::debug!(%peer, "settings request from {peer} timed out"),
                }
            });
        }
    });
    Ok(())
}

/// Answers one request; `Ok(true)` when the settings were sent.
async fn answer(shared: &Shared, mut stream: Stream) -> std::io::Result<bool> {
    let version = read_u16(&mut stream).await?;
    let refusal = if version != SETTINGS_VERSION {
        Some(format!(
            "settings request version {version}, we speak {SETTINGS_VERSION}"
        ))
    } else {
        let run_id = read_field(&mut stream).await?;
        let hash = read_field(&mut stream).await?;
        let run = &shared.cfg.run;
        // Neither value is echoed: a stranger learns only that it failed.
        if run_id != run.run_id.as_bytes() {
            Some("the run id is not this node's run".to_string())
        } else if hash != run.config_hash.as_bytes() {
            Some("the config hash is not this run's (settings changed since the ticket?)".into())
        } else {
            None
        }
    };
    let (status, body) = match &refusal {
        None => (OK, shared.cfg.settings_text.as_bytes()),
        Some(why) => (REFUSED, why.as_bytes()),
    };
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(status);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    stream.write_all(&out).await?;
    stream.flush().await?;
    stream.close().await?;
    Ok(refusal.is_none())
}

async fn read_u16(stream: &mut Stream) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    stream.read_exact(&mut b).await?;
    Ok(u16::from_be_bytes(b))
}

async fn read_field(stream: &mut Stream) -> std::io::Result<Vec<u8>> {
    let len = read_u16(stream).await?;
    if len > MAX_FIELD_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a field of {len} bytes (at most {MAX_FIELD_BYTES})"),
        ));
    }
    let mut v = vec![0u8; len as usize];
    stream.read_exact(&mut v).await?;
    Ok(v)
}

/// Asks the ticket's peers (`bootstrap`: multiaddrs ending in `/p2p/<id>`),
/// in turn, for the settings of run `run_id` whose SHA-256 is
/// `config_hash`; returns the first text that matches the hash. Runs its
/// own short-lived swarm under a fresh identity (the node's own starts
/// afterwards, with the settings).
pub fn fetch_settings(
    bootstrap: &[String],
    run_id: &str,
    config_hash: &str,
    wait: Duration,
) -> Result<String, SettingsError> {
    let addrs = parse_addrs("ticket address", bootstrap)
        .map_err(|e| SettingsError::Network(e.to_string()))?;
    let mut peers: Vec<(PeerId, Vec<Multiaddr>)> = Vec::new();
    for (a, text) in addrs.iter().zip(bootstrap) {
        let peer = super::addrs::peer_in(a).ok_or_else(|| SettingsError::Address(text.clone()))?;
        match peers.iter_mut().find(|(p, _)| *p == peer) {
            Some((_, known)) => known.push(a.clone()),
            None => peers.push((peer, vec![a.clone()])),
        }
    }
    let keypair =
        identity::load_or_create(None).map_err(|e| SettingsError::Network(e.to_string()))?;
    let cfg = P2pConfig::outside_run("settings", &[]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| SettingsError::Network(format!("starting the network runtime: {e}")))?;
    let result = rt.block_on(async {
        let (swarm, metrics) = super::swarm::listening_swarm(keypair, &cfg, Vec::new())
            .map_err(|e| SettingsError::Network(e.to_string()))?;
        let control = swarm.behaviour().stream.new_control();
        let (swarm_tx, swarm_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        tokio::spawn(behaviour::run_swarm(
            swarm,
            swarm_rx,
            events_tx,
            Arc::new(std::sync::Mutex::new(Vec::new())),
            addrs.clone(),
            metrics,
            NatSetup {
                reach: Reach::default(),
                relay_server: false,
                external: Vec::new(),
                namespace: None,
            },
        ));
        let mut asking = Asking {
            control,
            events: events_rx,
            swarm: &swarm_tx,
            peers,
        };
        let got = asking.settings(run_id, config_hash, wait).await;
        let _ = swarm_tx.send(SwarmCmd::Shutdown);
        got.ok_or_else(|| SettingsError::Unreachable {
            waited: wait,
            tried: bootstrap.join(", "),
        })?
    });
    rt.shutdown_timeout(Duration::from_millis(200));
    result
}

/// The ticket's peers and how to reach them, while a joiner asks.
struct Asking<'a> {
    control: libp2p_stream::Control,
    events: mpsc::UnboundedReceiver<NetEvent>,
    swarm: &'a mpsc::UnboundedSender<SwarmCmd>,
    /// Each peer of the ticket with its addresses.
    peers: Vec<(PeerId, Vec<Multiaddr>)>,
}

/// How long a joiner waits before it asks again after a request that
/// broke (a connection closed under it, a stream refused).
const RETRY_AFTER: Duration = Duration::from_millis(250);

impl Asking<'_> {
    /// Asks a connected peer of the ticket until one answers; a refusal
    /// or a hash that does not match is final (the ticket is wrong), a
    /// request that broke is asked again, re-dialing a peer whose
    /// connection closed. `None`: no peer answered within `wait`.
    async fn settings(
        &mut self,
        run_id: &str,
        config_hash: &str,
        wait: Duration,
    ) -> Option<Result<String, SettingsError>> {
        let until = Instant::now() + wait;
        let mut connected: Vec<PeerId> = Vec::new();
        let mut next_ask = Instant::now();
        loop {
            let ready = self
                .peers
                .iter()
                .map(|(p, _)| *p)
                .find(|p| connected.contains(p));
            if let Some(peer) = ready.filter(|_| Instant::now() >= next_ask) {
                let asked = tokio::time::timeout(
                    EXCHANGE_TIMEOUT,
                    ask(&mut self.control, peer, run_id, config_hash),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(SettingsError::Protocol {
                        peer: peer.to_string(),
                        why: format!("no answer within {EXCHANGE_TIMEOUT:?}"),
                    })
                });
                match asked {
                    Ok(text) => return Some(Ok(text)),
                    Err(
                        e @ (SettingsError::Refused { .. } | SettingsError::HashMismatch { .. }),
                    ) => {
                        return Some(Err(e));
                    }
                    Err(e) => {
                        tracing::debug!(%peer, "{e}; asking again");
                        next_ask = Instant::now() + RETRY_AFTER;
                        self.dial(peer);
                    }
                }
                continue;
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            let wake = if ready.is_some() {
                next_ask.min(until)
            } else {
                until
            };
            match tokio::time::timeout(wake.saturating_duration_since(now), self.events.recv())
                .await
            {
                Ok(Some(NetEvent::Connected { peer, .. })) => connected.push(peer),
                Ok(Some(NetEvent::Disconnected { peer })) => {
                    connected.retain(|p| *p != peer);
                    self.dial(peer);
                }
                Ok(Some(_)) | Err(_) => {}
                Ok(None) => return None,
            }
        }
    }

    /// Dials `peer` again if it is one of the ticket's (the swarm ignores
    /// the request while a connection to it is open).
    fn dial(&self, peer: PeerId) {
        if let Some((_, addrs)) = self.peers.iter().find(|(p, _)| *p == peer) {
            let _ = self.swarm.send(SwarmCmd::Dial {
                peer,
                addrs: addrs.clone(),
            });
        }
    }
}

async fn ask(
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    run_id: &str,
    config_hash: &str,
) -> Result<String, SettingsError> {
    let bad = |why: String| SettingsError::Protocol {
        peer: peer.to_string(),
        why,
    };
    let mut stream = control
        .open_stream(peer, StreamProtocol::new(SETTINGS_PROTOCOL))
        .await
        .map_err(|e| {
            bad(format!(
                "it does not serve settings ({e}): a node of another version?"
            ))
        })?;
    let mut req = Vec::new();
    req.extend_from_slice(&SETTINGS_VERSION.to_be_bytes());
    for field in [run_id.as_bytes(), config_hash.as_bytes()] {
        let len = u16::try_from(field.len())
            .ok()
            .filter(|l| *l <= MAX_FIELD_BYTES)
            .ok_or_else(|| bad("the ticket's run id or hash is too long".into()))?;
        req.extend_from_slice(&len.to_be_bytes());
        req.extend_from_slice(field);
    }
    let io = |e: std::io::Error| bad(e.to_string());
    stream.write_all(&req).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).await.map_err(io)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_SETTINGS_BYTES {
        return Err(bad(format!(
            "an answer of {len} bytes (at most {MAX_SETTINGS_BYTES})"
        )));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.map_err(io)?;
    let text = String::from_utf8(body).map_err(|_| bad("the answer is not UTF-8".into()))?;
    match head[0] {
        OK => {
            let got = settings_hash(&text);
            if got != config_hash {
                return Err(SettingsError::HashMismatch {
                    peer: peer.to_string(),
                    got,
                    expected: config_hash.to_string(),
                });
            }
            Ok(text)
        }
        REFUSED => Err(SettingsError::Refused {
            peer: peer.to_string(),
            reason: text,
        }),
        other => Err(bad(format!("status byte {other}"))),
    }
}
