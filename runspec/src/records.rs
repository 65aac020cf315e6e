//! What a node writes about its run: one [`StepRecord`] per step (the
//! metrics JSON lines) and one [`NodeSummary`] at the end.

use serde::{Deserialize, Serialize};

use crate::resolve::RunConfig;

/// Per-step metrics of one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u64,
    /// Seconds since the worker started.
    pub time: f64,
    pub loss: f32,
    pub lr: f32,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Push-sum weight of this worker.
    pub weight: f64,
    /// Push-sum rounds this worker has started (step + 1 for SGP and OSGP,
    /// fewer with background gossip over slow links; 0 without push-sum).
    pub gossip_rounds: u64,
    /// Mean over workers of ||z_i - z_bar|| (at evaluations and barriers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consensus_distance: Option<f64>,
    /// Standard deviation of the push-sum weights over workers (at evaluations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_spread: Option<f64>,
    /// `||e||` of this worker's compressed-average residual (at outer
    /// boundaries, with `--compress-average`): what it has not sent yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_residual_norm: Option<f64>,
    /// Mean over workers of their test accuracy (at evaluations; with
    /// background gossip, this worker's own, without any collective).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f32>,
    /// Mean over workers of the windowed train loss (at evaluations; this
    /// worker's own with background gossip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_loss: Option<f32>,
}

/// The records of a metrics JSON-lines text; lines that are not records
/// (a line cut short while the node writes it) are skipped.
pub fn step_records(text: &str) -> impl Iterator<Item = StepRecord> + '_ {
    text.lines().filter_map(|l| serde_json::from_str(l).ok())
}

/// The last record of a metrics JSON-lines text.
pub fn last_record(text: &str) -> Option<StepRecord> {
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
}

/// Steps per second over a metrics text: steps between the first and last
/// records over the time between them.
pub fn step_rate(text: &str) -> Option<f64> {
    let first = step_records(text).next()?;
    let last = last_record(text)?;
    (last.time > first.time).then(|| (last.step - first.step) as f64 / (last.time - first.time))
}

/// A node's final report (`slowmo node --summary-json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub rank: Option<usize>,
    pub peer_id: Option<String>,
    #[serde(default)]
    pub members: Vec<String>,
    pub completed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub steps: u64,
    pub final_train_loss: Option<f32>,
    /// Test accuracy of the exactly averaged model.
    pub test_accuracy: Option<f32>,
    /// Test accuracy of this node's own parameters.
    pub own_test_accuracy: Option<f32>,
    pub worker_accuracy_mean: Option<f32>,
    pub worker_accuracy_std: Option<f32>,
    pub consensus_distance: Option<f64>,
    /// The transformer: held-out loss of the exactly averaged model and its
    /// perplexity, and this node's training tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_loss: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_perplexity: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// This node's push-sum weight at the end of the run (after the drain,
    /// before the final average).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_sum_weight: Option<f64>,
    /// The sum of this node's de-biased parameters then: `push_sum_weight *
    /// params_sum` is the sum of its numerator, so the final average's sum
    /// is `sum_i (w_i * params_sum_i) / sum_i w_i`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_sum: Option<f64>,
    pub bytes_sent: u64,
    /// Of `bytes_sent`, those the data lane carried; the rest took libp2p
    /// streams (`slowmo node` only).
    #[serde(default)]
    pub lane_bytes_sent: u64,
    pub bytes_received: u64,
    pub messages_dropped: u64,
    pub wall_seconds: f64,
    pub steps_per_second: f64,
    /// Membership changes this node went through, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub view_changes: Vec<ViewEvent>,
    /// Why the run ended before its last step: `signal`, `output error` or
    /// `error` (absent when it ran to the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// With `--save-params`: whether the file holds the run's final averaged
    /// parameters (`false`: this node's own parameters when it stopped).
    /// Absent when no parameter file was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_final: Option<bool>,
    /// Outputs that could not be written, each with its flag, path and reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_errors: Vec<String>,
    /// How this node reached its peers (NAT traversal): absent in the
    /// simulator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<ConnectionsSummary>,
    pub config: RunConfig,
}

/// How a node reached its peers at the end of a run, and its hole punches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsSummary {
    /// Peers connected by a dial straight to their address.
    pub direct: usize,
    /// Peers connected directly by a hole punch (DCUtR).
    pub hole_punched: usize,
    /// Peers connected only through a relay.
    pub relayed: usize,
    pub punch_attempts: u64,
    pub punch_successes: u64,
    /// Relays holding a reservation for this node (peer ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relay_reservations: Vec<String>,
    /// Peers left out because only a relay reached them, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relay_only: Vec<String>,
}

/// One membership change as a worker saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewEvent {
    /// The new view's number.
    pub view: u64,
    /// Base steps this worker had completed when the change began.
    pub at_step: u64,
    /// The step training went on from (the barrier all members returned
    /// to): `at_step - resumed_from` steps were redone.
    pub resumed_from: u64,
    /// The worker's rank and the view's size afterwards.
    pub rank: usize,
    pub world: usize,
    /// Members that left (lost, or cut off by a partition) and peers that joined.
    pub lost: Vec<String>,
    pub joined: Vec<String>,
    /// This worker was outside the view for a while (a partition's minority,
    /// a restart) and came back through a join.
    pub rejoined: bool,
    /// The new view's members in rank order (`worker-W` in the simulator,
    /// peer ids over the network).
    #[serde(default)]
    pub members: Vec<String>,
    /// The rank that sent the training state to the joiners (absent when
    /// nobody joined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_sender: Option<usize>,
}

impl NodeSummary {
    /// The summary of a node that never started training.
    pub fn failed(config: &RunConfig, error: String) -> Self {
        NodeSummary {
            rank: None,
            peer_id: None,
            members: Vec::new(),
            completed: false,
            error: Some(error),
            steps: 0,
            final_train_loss: None,
            test_accuracy: None,
            own_test_accuracy: None,
            worker_accuracy_mean: None,
            worker_accuracy_std: None,
            consensus_distance: None,
            test_loss: None,
            test_perplexity: None,
            tokens_per_second: None,
            push_sum_weight: None,
            params_sum: None,
            bytes_sent: 0,
            lane_bytes_sent: 0,
            bytes_received: 0,
            messages_dropped: 0,
            wall_seconds: 0.0,
            steps_per_second: 0.0,
            view_changes: Vec::new(),
            stopped: None,
            params_final: None,
            output_errors: Vec::new(),
            connections: None,
            config: config.clone(),
        }
    }

    /// Parses a summary file's text.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrainOptions;

    pub(crate) fn record(step: u64, time: f64) -> StepRecord {
        StepRecord {
            step,
            time,
            loss: 1.0 / (step + 1) as f32,
            lr: 0.05,
            bytes_sent: 100 * step,
            bytes_received: 90 * step,
            weight: 1.0,
            gossip_rounds: step + 1,
            consensus_distance: None,
            weight_spread: None,
            average_residual_norm: None,
            test_accuracy: (step % 10 == 9).then_some(0.5),
            train_loss: None,
        }
    }

    #[test]
    fn metrics_give_the_last_record_and_the_step_rate() {
        let lines: Vec<String> = [record(0, 0.5), record(10, 2.5)]
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        // a last line cut short while the node writes it is skipped
        let text = format!("{}\n{}\n{{\"step\":11,\"ti\n", lines[0], lines[1]);
        assert_eq!(last_record(&text), Some(record(10, 2.5)));
        assert_eq!(step_rate(&text), Some(5.0));
        assert_eq!(step_rate(&lines[0]), None);
        assert!(last_record("").is_none());
    }

    #[test]
    fn summary_round_trips_with_its_config() {
        let config = TrainOptions {
            seed: Some(9),
            ..TrainOptions::default()
        }
        .resolve()
        .unwrap();
        let mut s = NodeSummary::failed(&config, "no peers".into());
        s.rank = Some(3);
        s.final_train_loss = Some(0.25);
        let text = serde_json::to_string_pretty(&s).unwrap();
        let back = NodeSummary::from_json(&text).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.config.hash(), config.hash());
    }
}
