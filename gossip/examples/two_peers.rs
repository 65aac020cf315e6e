//! Two peers on loopback: push-sum gossip, then an exact average.
//!
//! Each peer holds a vector and a push-sum weight, mixes them with the other
//! for a few rounds of the directed exponential graph (at two peers: send
//! half to the other every round), drains what is in flight and computes the
//! exact average `sum x / sum w` with one all-reduce. Both end with the same
//! bits.
//!
//! ```sh
//! # both peers in one process (threads), over QUIC on 127.0.0.1
//! cargo run -p slowmo-gossip --example two_peers
//! # or as two processes: the first prints its address, the second dials it
//! cargo run -p slowmo-gossip --example two_peers -- listen
//! cargo run -p slowmo-gossip --example two_peers -- dial /ip4/127.0.0.1/udp/PORT/quic-v1/p2p/PEER
//! ```

use std::time::Duration;

use slowmo_gossip::p2p::{P2pComm, P2pConfig, RunIdentity};
use slowmo_gossip::{Communicator, PushSumRound};

/// Floats each peer holds.
const LEN: usize = 8;
/// Push-sum rounds before the exact average.
const ROUNDS: u64 = 4;

fn config() -> P2pConfig {
    // Every peer of a run names the same run id, config hash and initial
    // parameter hash: a peer that differs is refused at the handshake.
    let identity = RunIdentity {
        run_id: "two-peers-example".into(),
        config_hash: "example".into(),
        init_hash: "example".into(),
    };
    P2pConfig::new(identity, 2, LEN)
        .with_join_timeout(Duration::from_secs(30))
        .with_peer_timeout(Duration::from_secs(10))
}

/// What one peer does once the run's first view is agreed.
fn work(comm: &mut P2pComm) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let rank = comm.rank();
    let other = 1 - rank;
    // Rank 0 starts at 0.0 everywhere, rank 1 at 10.0, 20.0, ...
    let mut x: Vec<f32> = (0..LEN).map(|i| (rank * 10 * (i + 1)) as f32).collect();
    let mut w = 1.0f64;
    for round in 0..ROUNDS {
        // A stand-in for a local training step, different on each peer.
        x.iter_mut().for_each(|v| *v += rank as f32);
        let r = PushSumRound {
            round,
            out_peers: &[other],
            in_peers: &[other],
            staleness: 0,
        };
        comm.push_sum(&r, &mut x, &mut w)?;
        println!(
            "rank {rank} round {round}: w = {w}, z[1] = {}",
            x[1] / w as f32
        );
    }
    comm.drain(&mut x, &mut w)?;
    // The exact average: sum of numerators over sum of weights.
    comm.all_reduce_sum(&mut x, &mut w)?;
    let z: Vec<f32> = x.iter().map(|v| v / w as f32).collect();
    println!("rank {rank}: exact average {z:?} (sum of weights {w})");
    Ok(z)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("listen") => {
            let first = P2pComm::bind(config())?;
            for a in first.listen_addrs() {
                println!("listening on {a}");
            }
            let mut comm = first.join()?;
            work(&mut comm)?;
            comm.shutdown();
        }
        Some("dial") => {
            let addr = args.get(1).ok_or("dial needs the listener's address")?;
            let mut comm = P2pComm::start(config().with_bootstrap([addr.clone()]))?;
            work(&mut comm)?;
            comm.shutdown();
        }
        None => {
            let first = P2pComm::bind(config())?;
            let boot = first.listen_addrs();
            let a = std::thread::spawn(move || -> Result<Vec<f32>, String> {
                let mut c = first.join().map_err(|e| e.to_string())?;
                let z = work(&mut c).map_err(|e| e.to_string());
                c.shutdown();
                z
            });
            let b = std::thread::spawn(move || -> Result<Vec<f32>, String> {
                let mut c =
                    P2pComm::start(config().with_bootstrap(boot)).map_err(|e| e.to_string())?;
                let z = work(&mut c).map_err(|e| e.to_string());
                c.shutdown();
                z
            });
            let za = a.join().map_err(|_| "peer thread panicked")??;
            let zb = b.join().map_err(|_| "peer thread panicked")??;
            assert_eq!(za, zb, "both peers hold the same bits");
            println!("both peers agree");
        }
        Some(other) => return Err(format!("unknown mode `{other}` (listen, dial ADDR)").into()),
    }
    Ok(())
}
