//! The libp2p communicator: real peers in real processes.
//!
//! A [`P2pComm`] owns a tokio runtime on background threads that drives a
//! libp2p swarm (QUIC first, TCP + Noise + Yamux as fallback; identify,
//! ping, optional mDNS). Its [`Communicator`] methods block the calling
//! (training) thread only as far as the algorithm demands: push-sum shares
//! are copied once and written by background tasks.
//!
//! Protocols (`/slowmo/<name>/<major>`):
//! - `membership/1`: join handshake and view agreement ([`membership`]);
//! - `push-sum/1`: push-sum shares (added by the crate's push-sum ledger);
//! - `all-reduce/1`: ring all-reduce chunks, also the barrier ([`allreduce`]),
//!   and the blocks of the typed collectives ([`gather`]);
//! - `lane/2`: offers of the data lane ([`lane`]), one per view, which then carries the
//!   frames of `push-sum/1` and `all-reduce/1` over its own TCP connections
//!   (unless [`DataLane::Libp2p`]);
//! - `settings/1`: the run's settings for a joiner holding a join ticket
//!   ([`settings`]).
//!
//! Tensor frames are a CBOR header and a raw little-endian payload
//! ([`wire`]); every inbound frame is checked ([`inbound`]).
//!
//! ```no_run
//! use slowmo_gossip::p2p::{P2pComm, P2pConfig, RunIdentity};
//! use slowmo_gossip::Communicator;
//! let run = RunIdentity { run_id: "demo".into(), config_hash: "c0ffee".into(), init_hash: "5eed".into() };
//! let cfg = P2pConfig::new(run, 2, 1000).with_bootstrap(["/ip4/127.0.0.1/udp/4001/quic-v1"]);
//! let mut comm = P2pComm::start(cfg)?;
//! let mut x = vec![1.0f32; 1000];
//! let mut w = 1.0;
//! comm.all_reduce_sum(&mut x, &mut w)?;
//! comm.shutdown();
//! # Ok::<(), slowmo_gossip::CommError>(())
//! ```

mod addrs;
mod admission;
mod allreduce;
mod behaviour;
mod comm;
mod command;
mod config;
mod counters;
pub mod doctor;
mod exchange;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
mod gather;
mod identity;
mod inbound;
mod landing;
pub mod lane;
pub(crate) mod lent;
mod links;
mod membership;
mod nat;
mod observe;
mod payload;
pub mod reach;
mod relay;
mod run_id;
pub mod settings;
mod start;
mod state;
mod swarm;
mod throttle;
mod udp;
mod views;
mod wait;
pub mod wire;

pub use admission::{
    Admission, Invitation, RunKey, parse_public_key, peer_id_of_identity, public_key_text,
    read_allowlist,
};
pub use comm::P2pComm;
pub use config::{
    DEFAULT_ROUND_WINDOW, DataLane, LanePeers, MetricsRegistry, P2pConfig, RunIdentity,
    default_lane_port, tcp_port_of,
};
pub use counters::{PeerTraffic, reason_name};
pub use observe::P2pObserver;
pub use relay::RelayServer;
pub use run_id::{MAX_RUN_ID_BYTES, check_run_id};
pub use start::PendingJoin;
