//! The outer loop's [`Exchange`] over a [`Communicator`]: what the state
//! machine in `optim` asks for, done by the protocol layer in `gossip` with
//! this round's peers from `topologies`.

use slowmo_gossip::compress::{Compression, compressed_average};
use slowmo_gossip::{
    CommError, Communicator, PushSumRound, ReduceOp, exact_average, unit_weight_average,
};
use slowmo_optim::{Exchange, PushSum};
use slowmo_topologies::Topology;

/// Sums small statistics over workers.
pub(crate) fn sum_over_workers(
    comm: &mut dyn Communicator,
    values: &[f64],
) -> Result<Vec<f64>, CommError> {
    // f32 transport, f64 scalar: enough for means of losses and accuracies.
    let mut buf: Vec<f32> = values.iter().map(|v| *v as f32).collect();
    let mut extra = 0.0;
    comm.all_reduce_sum(&mut buf, &mut extra)?;
    Ok(buf.into_iter().map(f64::from).collect())
}

/// Euclidean norm of a vector.
pub(crate) fn l2_norm(a: &[f32]) -> f64 {
    a.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt()
}

/// Euclidean distance of two parameter vectors.
pub(crate) fn l2_distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = f64::from(*x - *y);
            d * d
        })
        .sum::<f64>()
        .sqrt()
}

/// A worker's communicator and graph, as the outer loop's exchange.
pub struct CommExchange<'a> {
    pub comm: &'a mut dyn Communicator,
    topology: &'a dyn Topology,
    /// Measure the consensus distance at exact averages (push-sum bases).
    measure_consensus: bool,
    /// Mean over workers of ||z_i - z_bar|| at the latest exact average.
    consensus: Option<f64>,
    /// The codec of the compressed exact averages (`--compress-average`).
    average_codec: Compression,
    /// Every worker's push-sum weight is 1 by construction (no push-sum).
    unit_weights: bool,
}

impl<'a> CommExchange<'a> {
    pub fn new(
        comm: &'a mut dyn Communicator,
        topology: &'a dyn Topology,
        measure_consensus: bool,
    ) -> Self {
        Self {
            comm,
            topology,
            measure_consensus,
            consensus: None,
            average_codec: Compression::None,
            unit_weights: false,
        }
    }

    /// Every worker's weight is 1 by construction (a base without
    /// push-sum): the exact average folds its division into the all-reduce
    /// ([`unit_weight_average`], the same bits).
    pub fn with_unit_weights(mut self, unit: bool) -> Self {
        self.unit_weights = unit;
        self
    }

    /// Compressed exact averages at the outer boundaries use `codec`.
    pub fn with_average_codec(mut self, codec: Compression) -> Self {
        self.average_codec = codec;
        self
    }

    /// Runs `average` on the state and, when asked, measures the consensus
    /// distance it closed.
    fn measured(
        &mut self,
        state: &mut PushSum,
        average: impl FnOnce(&mut dyn Communicator, &mut PushSum) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let before = self.measure_consensus.then(|| state.debiased());
        average(&mut *self.comm, state)?;
        if let Some(before) = before {
            let d = sum_over_workers(&mut *self.comm, &[l2_distance(&before, &state.x)])?;
            self.consensus = Some(d[0] / self.comm.world_size() as f64);
        }
        Ok(())
    }

    /// The consensus distance measured at the latest exact average, once.
    pub fn take_consensus(&mut self) -> Option<f64> {
        self.consensus.take()
    }
}

impl Exchange for CommExchange<'_> {
    type Error = CommError;

    fn average_gradient(&mut self, grad: &mut [f32], loss: &mut f32) -> Result<(), CommError> {
        let m = self.comm.world_size();
        if m == 1 {
            return Ok(());
        }
        let mut loss_sum = f64::from(*loss);
        self.comm
            .all_reduce_sum_scaled(grad, &mut loss_sum, 1.0 / m as f32)?;
        *loss = (loss_sum / m as f64) as f32;
        Ok(())
    }

    fn push_sum_round(
        &mut self,
        round: u64,
        staleness: u64,
        state: &mut PushSum,
    ) -> Result<(), CommError> {
        let rank = self.comm.rank();
        let out_peers = self.topology.out_peers(rank, round);
        let in_peers = self.topology.in_peers(rank, round);
        self.comm.push_sum(
            &PushSumRound {
                round,
                out_peers: &out_peers,
                in_peers: &in_peers,
                staleness,
            },
            &mut state.x,
            &mut state.w,
        )
    }

    fn round_arrived(&mut self, round: u64) -> Result<bool, CommError> {
        self.comm.shares_arrived(round)
    }

    fn max_rounds(&mut self, rounds: u64) -> Result<u64, CommError> {
        let mut v = [rounds];
        self.comm.all_reduce_u64(&mut v, ReduceOp::Max)?;
        Ok(v[0])
    }

    fn drain(&mut self, state: &mut PushSum) -> Result<(), CommError> {
        self.comm.drain(&mut state.x, &mut state.w)
    }

    fn exact_average(&mut self, state: &mut PushSum) -> Result<(), CommError> {
        let unit = self.unit_weights;
        self.measured(state, |comm, s| match unit {
            true => unit_weight_average(comm, &mut s.x, &mut s.w),
            false => exact_average(comm, &mut s.x, &mut s.w),
        })
    }

    fn compressed_average(
        &mut self,
        state: &mut PushSum,
        anchor: &[f32],
        residual: &mut [f32],
    ) -> Result<(), CommError> {
        let codec = self.average_codec;
        self.measured(state, |comm, s| {
            compressed_average(comm, codec, &mut s.x, &mut s.w, anchor, residual)
        })
    }

    fn average_buffers(&mut self, buffers: Vec<&mut [f32]>) -> Result<(), CommError> {
        let m = self.comm.world_size();
        if m == 1 {
            return Ok(());
        }
        let inv = 1.0 / m as f32;
        for buf in buffers {
            let mut unused = 0.0;
            self.comm.all_reduce_sum_scaled(buf, &mut unused, inv)?;
        }
        Ok(())
    }
}
