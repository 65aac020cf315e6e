//! How fast a graph mixes, and what it costs.
//!
//! - Stochasticity: every push-sum matrix is column-stochastic by
//!   construction; it is also doubly stochastic when every rank's in-shares
//!   sum to one (e.g. regular graphs), and then push-sum weights stay at 1.
//! - Singular values (nalgebra SVD): for a doubly stochastic `W`, the second
//!   largest singular value `sigma2` is the worst-case contraction of the
//!   disagreement per application, so `1 - sigma2` (the spectral gap)
//!   predicts consensus speed. For time-varying graphs the product over one
//!   period is the matrix that matters. For graphs that are only column
//!   stochastic (star, irregular files) `sigma2` is still reported but is no
//!   longer a contraction factor; trust the measured rounds instead.
//! - Measured consensus: push-sum `(x, w)` is iterated from a seeded random
//!   start `x_i ~ U[0, 1)`, `w_i = 1`, and the error after round `k` is
//!   `max_i |x_i / w_i - mean| / max_i |x0_i - mean|` (so it starts at 1),
//!   where `mean` is the (conserved) average of the start.

use nalgebra::DMatrix;

use crate::random::SplitMix64;
use crate::{GraphSpec, MixingMatrix, Topology, TopologyError, build};

/// Bytes of framing counted per message on top of the payload (the push-sum
/// weight and a round tag).
pub const MESSAGE_OVERHEAD_BYTES: u64 = 8;

/// Tolerance for the stochasticity checks.
const STOCHASTIC_TOL: f64 = 1e-9;

/// What [`analyze`] measures and for how long.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AnalysisOptions {
    /// Target relative consensus error.
    pub epsilon: f64,
    /// Give up ("not reached") after this many rounds.
    pub max_rounds: u64,
    /// Model size in f32 values, for the bytes per round.
    pub model_floats: u64,
    /// Seed of the random start vector.
    pub start_seed: u64,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        Self {
            epsilon: 1e-4,
            max_rounds: 10_000,
            model_floats: 1_000_000,
            start_seed: 0,
        }
    }
}

/// Minimum, maximum and mean over every rank and every round of one period.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl Stats {
    fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let (mut min, mut max, mut sum, mut count) =
            (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize);
        for v in values {
            min = min.min(v);
            max = max.max(v);
            sum += v;
            count += 1;
        }
        if count == 0 {
            return Self {
                min: 0.0,
                max: 0.0,
                mean: 0.0,
            };
        }
        Self {
            min,
            max,
            mean: sum / count as f64,
        }
    }
}

/// Everything `slowmo topology analyze` reports about one graph and size.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Analysis {
    /// The graph spec (string form).
    pub graph: String,
    pub nodes: usize,
    /// Rounds after which the schedule repeats.
    pub period: u64,
    /// Every round's matrix of one period is doubly stochastic.
    pub doubly_stochastic: bool,
    /// Second-largest singular value of round 0's matrix.
    pub sigma2_round: f64,
    /// `1 - sigma2_round`.
    pub spectral_gap_round: f64,
    /// Second-largest singular value of the product over one period.
    pub sigma2_period: f64,
    /// `1 - sigma2_period`.
    pub spectral_gap_period: f64,
    /// Worst de-biased deviation from the exact average after one period,
    /// over one-hot starts: `max_ij |P_ij / (P 1)_i - 1/n|` (0 = exact).
    pub period_deviation: f64,
    pub epsilon: f64,
    pub max_rounds: u64,
    /// Seed of the random start vector of the measurement.
    pub start_seed: u64,
    /// First round after which the measured error is below `epsilon`;
    /// `None` = not reached within `max_rounds`.
    pub rounds_to_epsilon: Option<u64>,
    /// Error when the measurement stopped.
    pub final_error: f64,
    pub out_degree: Stats,
    pub in_degree: Stats,
    pub model_floats: u64,
    /// `model_floats * 4 + 8`.
    pub message_bytes: u64,
    /// Bytes one node sends in one round (out-degree x message bytes).
    pub bytes_per_round: Stats,
}

/// Largest size [`analyze`] accepts: the singular values need dense
/// `n x n` matrices (memory `8 n^2` bytes each, SVD time `O(n^3)`).
pub const MAX_ANALYSIS_NODES: usize = 2048;

/// [`build`], plus the [`MAX_ANALYSIS_NODES`] limit.
pub fn build_for_analysis(
    spec: &GraphSpec,
    nodes: usize,
) -> Result<Box<dyn Topology>, TopologyError> {
    if nodes > MAX_ANALYSIS_NODES {
        return Err(TopologyError::UnsupportedSize {
            graph: spec.to_string(),
            size: nodes,
            reason: format!(
                "the analysis uses dense n x n matrices and is limited to {MAX_ANALYSIS_NODES} nodes"
            ),
        });
    }
    build(spec, nodes)
}

/// Builds `spec` over `nodes` ranks and analyses it (at most
/// [`MAX_ANALYSIS_NODES`] nodes).
pub fn analyze(
    spec: &GraphSpec,
    nodes: usize,
    options: &AnalysisOptions,
) -> Result<Analysis, TopologyError> {
    let topology = build_for_analysis(spec, nodes)?;
    Ok(analyze_topology(
        topology.as_ref(),
        &spec.to_string(),
        options,
    ))
}

/// Analyses an already built graph; `label` fills [`Analysis::graph`].
pub fn analyze_topology(
    topology: &dyn Topology,
    label: &str,
    options: &AnalysisOptions,
) -> Analysis {
    let n = topology.size();
    let period = topology.period();
    let sigma2_round = second_singular_value(&topology.mixing_matrix(0));
    let product = period_product(topology);
    let sigma2_period = second_singular_value(&product);
    let (rounds, final_error) = rounds_to_consensus(
        topology,
        options.epsilon,
        options.max_rounds,
        options.start_seed,
    );
    let mut out_degrees = Vec::new();
    let mut in_degrees = Vec::new();
    let mut doubly = true;
    for k in 0..period {
        let out: Vec<usize> = (0..n).map(|r| topology.out_peers(r, k).len()).collect();
        for i in 0..n {
            let inn = topology.in_peers(i, k);
            let row: f64 = 1.0 / (out[i] + 1) as f64
                + inn.iter().map(|&j| 1.0 / (out[j] + 1) as f64).sum::<f64>();
            doubly &= (row - 1.0).abs() <= STOCHASTIC_TOL;
            in_degrees.push(inn.len() as f64);
        }
        out_degrees.extend(out.iter().map(|&d| d as f64));
    }
    let message_bytes = options
        .model_floats
        .saturating_mul(4)
        .saturating_add(MESSAGE_OVERHEAD_BYTES);
    let bytes_per_round = Stats::of(out_degrees.iter().map(|d| d * message_bytes as f64));
    Analysis {
        graph: label.to_string(),
        nodes: n,
        period,
        doubly_stochastic: doubly,
        sigma2_round,
        spectral_gap_round: 1.0 - sigma2_round,
        sigma2_period,
        spectral_gap_period: 1.0 - sigma2_period,
        period_deviation: max_deviation_from_average(&product),
        epsilon: options.epsilon,
        max_rounds: options.max_rounds,
        start_seed: options.start_seed,
        rounds_to_epsilon: rounds,
        final_error,
        out_degree: Stats::of(out_degrees),
        in_degree: Stats::of(in_degrees),
        model_floats: options.model_floats,
        message_bytes,
        bytes_per_round,
    }
}

/// Singular values of `m`, largest first.
pub fn singular_values(m: &MixingMatrix) -> Vec<f64> {
    let n = m.size();
    if n == 0 {
        return Vec::new();
    }
    let dense = DMatrix::from_row_slice(n, n, m.as_slice());
    let mut values: Vec<f64> = dense.singular_values().iter().copied().collect();
    values.sort_by(|a, b| b.total_cmp(a));
    values
}

/// The second-largest singular value (0 for a single node).
pub fn second_singular_value(m: &MixingMatrix) -> f64 {
    singular_values(m).get(1).copied().unwrap_or(0.0)
}

/// `W_{first+rounds-1} ... W_{first+1} W_first`: the mixing of `rounds`
/// consecutive rounds starting at `first` (sparse updates, no dense products).
pub fn product(topology: &dyn Topology, first: u64, rounds: u64) -> MixingMatrix {
    let n = topology.size();
    let mut rows = MixingMatrix::identity(n).as_slice().to_vec();
    for k in first..first.saturating_add(rounds) {
        let shares: Vec<f64> = (0..n).map(|j| topology.mixing_weight(j, k)).collect();
        let mut next = vec![0.0; n * n];
        for i in 0..n {
            let target = &mut next[i * n..(i + 1) * n];
            let own = shares[i];
            for (t, v) in target.iter_mut().zip(&rows[i * n..(i + 1) * n]) {
                *t += own * v;
            }
            for j in topology.in_peers(i, k) {
                let share = shares[j];
                for (t, v) in target.iter_mut().zip(&rows[j * n..(j + 1) * n]) {
                    *t += share * v;
                }
            }
        }
        rows = next;
    }
    MixingMatrix::from_row_major(n, rows).unwrap_or_else(|| MixingMatrix::identity(n))
}

/// The product over one period, starting at round 0.
pub fn period_product(topology: &dyn Topology) -> MixingMatrix {
    product(topology, 0, topology.period())
}

/// `max_ij |P_ij / (P 1)_i - 1/n|`: how far the de-biased push-sum values
/// are from the exact average after `P`, starting from one-hot vectors.
pub fn max_deviation_from_average(p: &MixingMatrix) -> f64 {
    let n = p.size();
    let target = 1.0 / n.max(1) as f64;
    let weights = p.row_sums();
    let mut worst: f64 = 0.0;
    for (i, w) in weights.iter().enumerate() {
        for j in 0..n {
            worst = worst.max((p.get(i, j) / w - target).abs());
        }
    }
    worst
}

/// Push-sum state `(x, w)` for measuring consensus.
#[derive(Debug, Clone)]
struct PushSum {
    x: Vec<f64>,
    w: Vec<f64>,
    mean: f64,
    spread: f64,
}

impl PushSum {
    fn random(n: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let x: Vec<f64> = (0..n).map(|_| rng.next_f64()).collect();
        let mean = x.iter().sum::<f64>() / n.max(1) as f64;
        let spread = x.iter().map(|v| (v - mean).abs()).fold(0.0, f64::max);
        Self {
            w: vec![1.0; n],
            x,
            mean,
            spread,
        }
    }

    fn error(&self) -> f64 {
        if self.spread == 0.0 {
            return 0.0;
        }
        let worst = self
            .x
            .iter()
            .zip(&self.w)
            .map(|(x, w)| (x / w - self.mean).abs())
            .fold(0.0, f64::max);
        worst / self.spread
    }

    fn step(&mut self, topology: &dyn Topology, round: u64) {
        let n = self.x.len();
        let mut x = vec![0.0; n];
        let mut w = vec![0.0; n];
        for j in 0..n {
            let out = topology.out_peers(j, round);
            let share = 1.0 / (out.len() + 1) as f64;
            let (sx, sw) = (share * self.x[j], share * self.w[j]);
            for i in std::iter::once(j).chain(out) {
                x[i] += sx;
                w[i] += sw;
            }
        }
        self.x = x;
        self.w = w;
    }
}

/// Relative consensus error after rounds `0..=rounds` (entry 0 is the start,
/// 1.0 unless all start values are equal), from the seeded random start.
pub fn consensus_curve(topology: &dyn Topology, rounds: u64, seed: u64) -> Vec<f64> {
    let mut state = PushSum::random(topology.size(), seed);
    let mut curve = Vec::with_capacity(rounds.min(1 << 20) as usize + 1);
    curve.push(state.error());
    for k in 0..rounds {
        state.step(topology, k);
        curve.push(state.error());
    }
    curve
}

/// The first round count after which the error is below `epsilon`, or
/// `None` if that does not happen within `max_rounds`; plus the error at the
/// stopping point.
pub fn rounds_to_consensus(
    topology: &dyn Topology,
    epsilon: f64,
    max_rounds: u64,
    seed: u64,
) -> (Option<u64>, f64) {
    let mut state = PushSum::random(topology.size(), seed);
    let mut error = state.error();
    for k in 0..=max_rounds {
        if error < epsilon {
            return (Some(k), error);
        }
        if k == max_rounds {
            break;
        }
        state.step(topology, k);
        error = state.error();
    }
    (None, error)
}
