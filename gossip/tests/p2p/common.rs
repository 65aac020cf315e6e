//! Helpers: groups of real libp2p nodes on 127.0.0.1 inside one process.

use std::sync::Once;
use std::thread;
use std::time::Duration;

use slowmo_gossip::p2p::{P2pComm, P2pConfig, RunIdentity};

pub fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "slowmo_gossip=warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

pub fn run_identity() -> RunIdentity {
    RunIdentity {
        run_id: "test-run".into(),
        config_hash: "c0ffee".into(),
        init_hash: "5eed".into(),
    }
}

/// A config for `nodes` peers with short timeouts and two worker threads.
pub fn config(nodes: usize, payload: usize) -> P2pConfig {
    let mut cfg = P2pConfig::new(run_identity(), nodes, payload)
        .with_join_timeout(Duration::from_secs(20))
        .with_peer_timeout(Duration::from_secs(10));
    cfg.worker_threads = 2;
    cfg
}

/// Starts `n` nodes: node 0 first, the others bootstrapped from it only
/// (they must find each other through member lists). Returned in rank order.
pub fn group(n: usize, payload: usize, tweak: impl Fn(P2pConfig) -> P2pConfig) -> Vec<P2pComm> {
    init_logs();
    let first = P2pComm::bind(tweak(config(n, payload))).expect("bind node 0");
    let boot = first.listen_addrs();
    let mut handles = vec![thread::spawn(move || first.join())];
    for _ in 1..n {
        let cfg = tweak(config(n, payload)).with_bootstrap(boot.clone());
        handles.push(thread::spawn(move || P2pComm::start(cfg)));
    }
    let mut comms: Vec<P2pComm> = handles
        .into_iter()
        .map(|h| h.join().expect("join thread").expect("node joins"))
        .collect();
    comms.sort_by_key(slowmo_gossip::Communicator::rank);
    comms
}

/// Runs `f` on every node in its own thread and returns the results in
/// rank order (and the nodes, for further use).
pub fn on_all<T: Send + 'static>(
    comms: Vec<P2pComm>,
    f: impl Fn(&mut P2pComm) -> T + Send + Sync + Clone + 'static,
) -> (Vec<P2pComm>, Vec<T>) {
    let handles: Vec<_> = comms
        .into_iter()
        .map(|mut c| {
            let f = f.clone();
            thread::spawn(move || {
                let out = f(&mut c);
                (c, out)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("worker thread"))
        .unzip()
}

/// Deterministic pseudo-random floats in [-1, 1).
pub fn floats(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn shutdown_all(comms: Vec<P2pComm>) {
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| thread::spawn(move || c.shutdown()))
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
