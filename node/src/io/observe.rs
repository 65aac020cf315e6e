//! The live metrics endpoint of `slowmo node --metrics-addr HOST:PORT`:
//! `GET /metrics` answers in the Prometheus (OpenMetrics) text format.
//!
//! Three sources fill one registry: the training loop's step records
//! ([`Endpoint::record`]: step, loss, lr, accuracy, weight, consensus
//! distance, gossip rounds, step time), the communicator's counters read at
//! every scrape ([`Endpoint::attach`]: bytes and messages per peer, drops
//! by reason, timeouts, the view), and libp2p's own metrics (connections,
//! protocols, bandwidth, identify, ping) recorded by the swarm into the
//! same registry ([`Endpoint::registry`]). hyper's HTTP/1 server on a
//! thread of its own serves it, with bounded requests, timeouts and a cap
//! on connections ([`super::metrics_http`]).
//!
//! ```sh
//! slowmo node --metrics-addr 127.0.0.1:9100 ...
//! curl -s 127.0.0.1:9100/metrics | grep slowmo_step
//! ```

use slowmo_gossip::sync::lock;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use slowmo_gossip::p2p::reach::ConnectionKind;
use slowmo_gossip::p2p::{MetricsRegistry, P2pObserver};
use slowmo_runspec::StepRecord;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The metrics of one node; every handle is shared (cloning is cheap).
#[derive(Clone)]
struct NodeMetrics {
    step: Gauge,
    loss: FloatGauge,
    lr: FloatGauge,
    test_accuracy: FloatGauge,
    train_loss: FloatGauge,
    weight: FloatGauge,
    consensus_distance: FloatGauge,
    weight_spread: FloatGauge,
    average_residual_norm: FloatGauge,
    gossip_rounds: Gauge,
    evaluations: Counter,
    barriers: Counter,
    step_seconds: Histogram,
    // from the communicator, refreshed at each scrape
    bytes_sent: Counter,
    bytes_received: Counter,
    messages_sent: Counter,
    messages_received: Counter,
    messages_dropped: Counter,
    peer_bytes: Family<Labels, Counter>,
    peer_messages: Family<Labels, Counter>,
    peer_timeouts: Family<Labels, Counter>,
    drops_by_reason: Family<Labels, Counter>,
    timeouts: Counter,
    view_size: Gauge,
    view_number: Gauge,
    view_changes: Counter,
    peer_connection: Family<Labels, Gauge>,
    hole_punches: Family<Labels, Counter>,
    relay_reservations: Gauge,
}

impl NodeMetrics {
    fn new() -> Self {
        Self {
            step: Default::default(),
            loss: Default::default(),
            lr: Default::default(),
            test_accuracy: Default::default(),
            train_loss: Default::default(),
            weight: Default::default(),
            consensus_distance: Default::default(),
            weight_spread: Default::default(),
            average_residual_norm: Default::default(),
            gossip_rounds: Default::default(),
            evaluations: Default::default(),
            barriers: Default::default(),
            // 0.5 ms .. about 16 s
            step_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            bytes_sent: Default::default(),
            bytes_received: Default::default(),
            messages_sent: Default::default(),
            messages_received: Default::default(),
            messages_dropped: Default::default(),
            peer_bytes: Default::default(),
            peer_messages: Default::default(),
            peer_timeouts: Default::default(),
            drops_by_reason: Default::default(),
            timeouts: Default::default(),
            view_size: Default::default(),
            view_number: Default::default(),
            view_changes: Default::default(),
            peer_connection: Default::default(),
            hole_punches: Default::default(),
            relay_reservations: Default::default(),
        }
    }

    fn register(&self, r: &mut Registry) {
        let m = self.clone();
        r.register("step", "Base steps this node has completed", m.step);
        r.register("loss", "Mini-batch loss of the latest step", m.loss);
        r.register("lr", "Base learning rate of the latest step", m.lr);
        r.register(
            "test_accuracy",
            "Test accuracy at the latest evaluation (mean over nodes, or this node's own with background gossip)",
            m.test_accuracy,
        );
        r.register(
            "train_loss",
            "Windowed train loss at the latest evaluation",
            m.train_loss,
        );
        r.register("push_sum_weight", "This node's push-sum weight", m.weight);
        r.register(
            "consensus_distance",
            "Mean over nodes of ||z_i - z_bar|| at the latest barrier or evaluation",
            m.consensus_distance,
        );
        r.register(
            "weight_spread",
            "Standard deviation of the push-sum weights at the latest evaluation",
            m.weight_spread,
        );
        r.register(
            "average_residual_norm",
            "||e|| of what the compressed exact average kept back at the latest barrier (--compress-average)",
            m.average_residual_norm,
        );
        r.register(
            "gossip_rounds",
            "Push-sum rounds this node has started",
            m.gossip_rounds,
        );
        r.register("evaluations", "Evaluations recorded", m.evaluations);
        r.register(
            "barriers",
            "Outer barriers that measured the consensus distance",
            m.barriers,
        );
        r.register(
            "step_seconds",
            "Wall time between consecutive step records (waits included)",
            m.step_seconds,
        );
        r.register("bytes_sent", "Tensor bytes sent to peers", m.bytes_sent);
        r.register(
            "bytes_received",
            "Tensor bytes received from peers",
            m.bytes_received,
        );
        r.register(
            "messages_sent",
            "Tensor messages sent to peers",
            m.messages_sent,
        );
        r.register(
            "messages_received",
            "Tensor messages received from peers",
            m.messages_received,
        );
        r.register(
            "messages_dropped",
            "Messages refused by validation",
            m.messages_dropped,
        );
        r.register(
            "peer_bytes",
            "Tensor bytes per peer and direction",
            m.peer_bytes,
        );
        r.register(
            "peer_messages",
            "Tensor messages per peer and direction (dropped: refused from that peer)",
            m.peer_messages,
        );
        r.register(
            "peer_timeouts",
            "Waits on a peer that gave up after the peer timeout of silence",
            m.peer_timeouts,
        );
        r.register(
            "dropped_messages_by_reason",
            "Messages refused by validation, by reason",
            m.drops_by_reason,
        );
        r.register("timeouts", "Peer timeouts, all peers", m.timeouts);
        r.register("view_size", "Members of the current view", m.view_size);
        r.register("view_number", "Number of the current view", m.view_number);
        r.register(
            "view_changes",
            "View changes since this node joined its first view",
            m.view_changes,
        );
        r.register(
            "peer_connection",
            "1 for the kind of this node's connection to a peer (direct, hole-punched, relayed), 0 for the others",
            m.peer_connection,
        );
        r.register(
            "hole_punches",
            "Hole punches (DCUtR) with peers, by result (attempted, succeeded)",
            m.hole_punches,
        );
        r.register(
            "relay_reservations",
            "Relays holding a reservation for this node",
            m.relay_reservations,
        );
    }

    fn record(&self, r: &StepRecord, previous_time: Option<f64>) {
        self.step.set((r.step + 1) as i64);
        self.loss.set(f64::from(r.loss));
        self.lr.set(f64::from(r.lr));
        self.weight.set(r.weight);
        self.gossip_rounds.set(r.gossip_rounds as i64);
        if let Some(a) = r.test_accuracy {
            self.test_accuracy.set(f64::from(a));
            self.evaluations.inc();
        }
        if let Some(l) = r.train_loss {
            self.train_loss.set(f64::from(l));
        }
        if let Some(d) = r.consensus_distance {
            self.consensus_distance.set(d);
            if r.test_accuracy.is_none() {
                self.barriers.inc();
            }
        }
        if let Some(s) = r.weight_spread {
            self.weight_spread.set(s);
        }
        if let Some(e) = r.average_residual_norm {
            self.average_residual_norm.set(e);
        }
        if let Some(t0) = previous_time
            && r.time >= t0
        {
            self.step_seconds.observe(r.time - t0);
        }
    }
}

/// Raises a counter to an absolute count read from elsewhere.
fn raise(counter: &Counter, to: u64) {
    counter.inc_by(to.saturating_sub(counter.get()));
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What the scrape thread reads from the communicator.
#[derive(Default)]
struct Live {
    observer: Option<P2pObserver>,
    first_view: Option<u64>,
}

impl Live {
    /// Copies the communicator's counters into the metrics.
    fn refresh(&mut self, m: &NodeMetrics) {
        let Some(o) = &self.observer else { return };
        let s = o.stats();
        raise(&m.bytes_sent, s.bytes_sent);
        raise(&m.bytes_received, s.bytes_received);
        raise(&m.messages_sent, s.messages_sent);
        raise(&m.messages_received, s.messages_received);
        raise(&m.messages_dropped, s.messages_dropped);
        let mut timeouts = 0;
        for (peer, t) in o.peers() {
            let bytes = |dir| {
                m.peer_bytes
                    .get_or_create_owned(&labels(&[("peer", &peer), ("direction", dir)]))
            };
            raise(&bytes("sent"), t.bytes_sent);
            raise(&bytes("received"), t.bytes_received);
            let msgs = |dir| {
                m.peer_messages
                    .get_or_create_owned(&labels(&[("peer", &peer), ("direction", dir)]))
            };
            raise(&msgs("sent"), t.messages_sent);
            raise(&msgs("received"), t.messages_received);
            raise(&msgs("dropped"), t.messages_dropped);
            raise(
                &m.peer_timeouts
                    .get_or_create_owned(&labels(&[("peer", &peer)])),
                t.timeouts,
            );
            timeouts += t.timeouts;
        }
        raise(&m.timeouts, timeouts);
        for (reason, n) in o.drops() {
            raise(
                &m.drops_by_reason
                    .get_or_create_owned(&labels(&[("reason", reason)])),
                n,
            );
        }
        let reach = o.reach();
        for (peer, kind) in reach.peer_kinds() {
            for k in [
                ConnectionKind::Direct,
                ConnectionKind::HolePunched,
                ConnectionKind::Relayed,
            ] {
                m.peer_connection
                    .get_or_create_owned(&labels(&[("peer", &peer), ("kind", k.name())]))
                    .set(i64::from(k == kind));
            }
        }
        let (attempted, succeeded) = reach.punches();
        raise(
            &m.hole_punches
                .get_or_create_owned(&labels(&[("result", "attempted")])),
            attempted,
        );
        raise(
            &m.hole_punches
                .get_or_create_owned(&labels(&[("result", "succeeded")])),
            succeeded,
        );
        m.relay_reservations.set(reach.reservations.len() as i64);
        if let Some((number, size)) = o.view() {
            let first = *self.first_view.get_or_insert(number);
            m.view_size.set(size as i64);
            m.view_number.set(number as i64);
            raise(&m.view_changes, number.saturating_sub(first));
        }
    }
}

/// A running metrics endpoint. Dropping it leaves the server thread
/// serving until the process ends (it holds nothing but the registry).
pub struct Endpoint {
    addr: SocketAddr,
    registry: MetricsRegistry,
    metrics: NodeMetrics,
    live: Arc<Mutex<Live>>,
    last_time: Mutex<Option<f64>>,
}

impl Endpoint {
    /// Binds `addr` (`HOST:PORT`; port 0 picks one) and starts serving.
    pub fn start(addr: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("--metrics-addr {addr}: cannot listen there"))?;
        let addr = listener.local_addr()?;
        let mut registry = Registry::default();
        let metrics = NodeMetrics::new();
        metrics.register(registry.sub_registry_with_prefix("slowmo"));
        let registry: MetricsRegistry = Arc::new(Mutex::new(registry));
        let live = Arc::new(Mutex::new(Live::default()));
        let server = Server {
            registry: registry.clone(),
            metrics: metrics.clone(),
            live: live.clone(),
        };
        let scrape: super::metrics_http::Scrape = Arc::new(move || {
            server
                .scrape()
                .map_err(|_| "encoding the metrics failed".to_string())
        });
        std::thread::Builder::new()
            .name("slowmo-metrics".into())
            .spawn(move || super::metrics_http::serve(listener, scrape))
            .context("starting the metrics thread")?;
        tracing::info!("metrics on http://{addr}/metrics");
        Ok(Self {
            addr,
            registry,
            metrics,
            live,
            last_time: Mutex::new(None),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The registry libp2p's metrics go into (`P2pConfig::metrics`).
    pub fn registry(&self) -> MetricsRegistry {
        self.registry.clone()
    }

    /// Reads the communicator's counters at every scrape from now on.
    pub fn attach(&self, observer: P2pObserver) {
        lock(&self.live).observer = Some(observer);
    }

    /// One step's record from the training loop.
    pub fn record(&self, r: &StepRecord) {
        let mut last = lock(&self.last_time);
        self.metrics.record(r, *last);
        *last = Some(r.time);
    }
}

/// What a scrape reads.
struct Server {
    registry: MetricsRegistry,
    metrics: NodeMetrics,
    live: Arc<Mutex<Live>>,
}

impl Server {
    /// The text of a scrape.
    fn scrape(&self) -> Result<String, std::fmt::Error> {
        lock(&self.live).refresh(&self.metrics);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &lock(&self.registry))?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }

    fn record(step: u64, time: f64) -> StepRecord {
        StepRecord {
            step,
            time,
            loss: 0.75,
            lr: 0.05,
            bytes_sent: 0,
            bytes_received: 0,
            weight: 0.5,
            gossip_rounds: step + 1,
            consensus_distance: Some(0.125),
            weight_spread: None,
            average_residual_norm: None,
            test_accuracy: (step == 9).then_some(0.875),
            train_loss: None,
        }
    }

    #[test]
    fn serves_the_recorded_steps_in_the_text_format() {
        let e = Endpoint::start("127.0.0.1:0").unwrap();
        e.record(&record(8, 1.0));
        e.record(&record(9, 1.25));
        let text = get(e.addr(), "/metrics");
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        for line in [
            "slowmo_step 10",
            "slowmo_loss 0.75",
            "slowmo_push_sum_weight 0.5",
            "slowmo_gossip_rounds 10",
            "slowmo_test_accuracy 0.875",
            "slowmo_consensus_distance 0.125",
            "slowmo_evaluations_total 1",
            "slowmo_barriers_total 1",
            "slowmo_step_seconds_count 1",
            "slowmo_step_seconds_sum 0.25",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
        let missing = get(e.addr(), "/other");
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    }

    #[test]
    fn an_address_in_use_is_named() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = format!("{:#}", Endpoint::start(&addr).err().unwrap());
        assert!(err.contains(&format!("--metrics-addr {addr}")), "{err}");
        let err = format!("{:#}", Endpoint::start("not-an-address").err().unwrap());
        assert!(err.contains("--metrics-addr not-an-address"), "{err}");
    }
}
