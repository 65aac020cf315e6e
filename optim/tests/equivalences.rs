//! The outer loop end to end: the real state machine ([`OuterLoop`], the one
//! the training loop runs) on a small least-squares problem with m workers in
//! m threads, checked against direct implementations of the special cases in
//! docs/algorithm.md (Local SGD, heavy-ball SGD, BMUF, Lookahead, the
//! noaverage variant over push-sum gossip, plain SGP).

use std::sync::{Barrier, Mutex};

use slowmo_optim::{
    Algorithm, Base, BufferPolicy, Exchange, Optimizer, OptimizerConfig, OptimizerKind, OuterLoop,
    PushSum, Rng, Schedule, SlowMoConfig,
};

const D: usize = 6;
const N: usize = 8;

/// Worker i minimises 0.5 * mean over its rows of (a_r . x - b_r)^2.
struct Problem {
    a: Vec<Vec<f64>>,
    b: Vec<Vec<f64>>,
}

impl Problem {
    fn new(m: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let scale = 1.0 / (D as f64).sqrt();
        let a = (0..m)
            .map(|_| (0..N * D).map(|_| rng.normal() * scale).collect())
            .collect();
        let b = (0..m)
            .map(|_| (0..N).map(|_| rng.normal()).collect())
            .collect();
        Self { a, b }
    }

    fn m(&self) -> usize {
        self.a.len()
    }

    fn x0(&self) -> Vec<f32> {
        (0..D).map(|k| 0.5 - 0.2 * k as f32).collect()
    }

    /// Mini-batch gradient of worker i for base step `step` (rows 2s, 2s+1 mod N).
    fn grad64(&self, i: usize, x: &[f64], step: u64) -> Vec<f64> {
        let mut g = vec![0.0; D];
        for j in 0..2 {
            let r = ((2 * step + j) % N as u64) as usize;
            let row = &self.a[i][r * D..(r + 1) * D];
            let resid = row.iter().zip(x).map(|(a, x)| a * x).sum::<f64>() - self.b[i][r];
            for (gk, ak) in g.iter_mut().zip(row) {
                *gk += resid * ak / 2.0;
            }
        }
        g
    }

    fn grad(&self, i: usize, x: &[f32], step: u64) -> Vec<f32> {
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        self.grad64(i, &x, step)
            .into_iter()
            .map(|v| v as f32)
            .collect()
    }
}

fn mean(xs: &[Vec<f32>]) -> Vec<f32> {
    (0..xs[0].len())
        .map(|k| (xs.iter().map(|x| x[k] as f64).sum::<f64>() / xs.len() as f64) as f32)
        .collect()
}

fn to64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// `||got - want||_inf <= rel * max(||want||_inf, 1)`.
fn assert_close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
    assert!(
        err <= rel * scale,
        "{what}: error {err:e} > {rel:e} * {scale}\n got {got:?}\nwant {want:?}"
    );
}

struct Run {
    opt: OptimizerConfig,
    slowmo: SlowMoConfig,
    schedule: Schedule,
    base_lr: f32,
    outer_iters: u64,
}

impl Run {
    fn lr(&self, step: u64) -> f32 {
        let total = self.slowmo.tau * self.outer_iters;
        self.schedule.lr(self.base_lr, step, total)
    }

    /// gamma_t: the base lr at the barrier step of outer iteration t.
    fn gamma(&self, t: u64) -> f32 {
        self.lr(t * self.slowmo.tau + self.slowmo.tau - 1)
    }
}

fn sgd(momentum: f32, nesterov: bool) -> OptimizerConfig {
    OptimizerConfig {
        kind: OptimizerKind::Sgd,
        momentum,
        nesterov,
        ..OptimizerConfig::default()
    }
}

fn outer(tau: u64, alpha: f32, beta: f32) -> SlowMoConfig {
    SlowMoConfig {
        tau,
        alpha,
        beta,
        ..SlowMoConfig::default()
    }
}

/// The exchange of m workers that run in m threads and meet at a barrier:
/// every collective deposits each worker's values on a shared board, waits
/// for all, and computes the result from the board in rank order.
struct Board {
    barrier: Barrier,
    slots: Mutex<Vec<Option<Slot>>>,
}

/// A worker's deposit: a vector, a scalar and (for gossip) its out-peers.
type Slot = (Vec<f32>, f64, Vec<usize>);

struct Lockstep<'a> {
    rank: usize,
    board: &'a Board,
    graph: Graph,
}

/// Out-peers of worker `i` of `m` in gossip round `round`.
type Graph = fn(usize, usize, u64) -> Vec<usize>;

impl Lockstep<'_> {
    fn all(&self, mine: Slot) -> Vec<Slot> {
        self.board.slots.lock().unwrap()[self.rank] = Some(mine);
        self.board.barrier.wait();
        let all = self
            .board
            .slots
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.clone().unwrap())
            .collect();
        // Nobody deposits the next collective before everyone read this one.
        self.board.barrier.wait();
        all
    }
}

impl Exchange for Lockstep<'_> {
    type Error = std::convert::Infallible;

    fn average_gradient(&mut self, grad: &mut [f32], loss: &mut f32) -> Result<(), Self::Error> {
        let all = self.all((grad.to_vec(), f64::from(*loss), Vec::new()));
        let grads: Vec<Vec<f32>> = all.iter().map(|s| s.0.clone()).collect();
        grad.copy_from_slice(&mean(&grads));
        *loss = (all.iter().map(|s| s.1).sum::<f64>() / all.len() as f64) as f32;
        Ok(())
    }

    fn push_sum_round(&mut self, round: u64, _: u64, s: &mut PushSum) -> Result<(), Self::Error> {
        let m = self.board.slots.lock().unwrap().len();
        let outs = (self.graph)(m, self.rank, round);
        s.scale(1.0 / (outs.len() + 1) as f64);
        for (x, w, outs) in self.all((s.x.clone(), s.w, outs)) {
            if outs.contains(&self.rank) {
                s.add_share(&x, w).unwrap();
            }
        }
        Ok(())
    }

    fn round_arrived(&mut self, _: u64) -> Result<bool, Self::Error> {
        Ok(true)
    }

    fn max_rounds(&mut self, rounds: u64) -> Result<u64, Self::Error> {
        let all = self.all((Vec::new(), rounds as f64, Vec::new()));
        Ok(all.iter().map(|s| s.1 as u64).max().unwrap())
    }

    fn drain(&mut self, _: &mut PushSum) -> Result<(), Self::Error> {
        Ok(())
    }

    fn exact_average(&mut self, s: &mut PushSum) -> Result<(), Self::Error> {
        let all = self.all((s.x.clone(), s.w, Vec::new()));
        let total_w: f64 = all.iter().map(|s| s.1).sum();
        let avg: Vec<f32> = (0..s.len())
            .map(|k| (all.iter().map(|s| s.0[k] as f64).sum::<f64>() / total_w) as f32)
            .collect();
        s.set_average(&avg);
        Ok(())
    }

    fn compressed_average(
        &mut self,
        _: &mut PushSum,
        _: &[f32],
        _: &mut [f32],
    ) -> Result<(), Self::Error> {
        unreachable!("the equivalence runs average exactly")
    }

    fn average_buffers(&mut self, buffers: Vec<&mut [f32]>) -> Result<(), Self::Error> {
        for buf in buffers {
            let all = self.all((buf.to_vec(), 0.0, Vec::new()));
            let bufs: Vec<Vec<f32>> = all.into_iter().map(|s| s.0).collect();
            buf.copy_from_slice(&mean(&bufs));
        }
        Ok(())
    }
}

/// What one worker's machine went through: `z` after every outer boundary
/// (starting with x0), and the machine at the end.
struct Worker {
    traj: Vec<Vec<f32>>,
    machine: OuterLoop,
}

/// Runs the real outer-loop state machine on every worker of `p`, one thread
/// each, gossiping over `graph` when the base uses push-sum.
fn run_machines(p: &Problem, run: &Run, base: Base, graph: Graph) -> Vec<Worker> {
    let m = p.m();
    let alg = Algorithm {
        base,
        slowmo: run.slowmo.clone(),
        staleness: 0,
        background_gossip: false,
    };
    let board = Board {
        barrier: Barrier::new(m),
        slots: Mutex::new(vec![None; m]),
    };
    let steps = run.slowmo.tau * run.outer_iters;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..m)
            .map(|rank| {
                let (alg, board) = (alg.clone(), &board);
                scope.spawn(move || {
                    let mut net = Lockstep { rank, board, graph };
                    let mut machine = OuterLoop::new(alg, &run.opt, p.x0()).unwrap();
                    let mut traj = vec![p.x0()];
                    for s in 0..steps {
                        let mut g = p.grad(rank, machine.params(), s);
                        let report = machine.step(&mut net, &mut g, &mut 0.0, run.lr(s)).unwrap();
                        if report.outer_boundary {
                            traj.push(machine.params().to_vec());
                        }
                    }
                    Worker { traj, machine }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn no_gossip(_: usize, _: usize, _: u64) -> Vec<usize> {
    Vec::new()
}

/// The loop with an exact average and no gossip (Local SGD base), run by the
/// state machine; returns x_{t,0}, t = 0..=T (the same on every worker).
fn compose_averaged(p: &Problem, run: &Run) -> Vec<Vec<f32>> {
    let workers = run_machines(p, run, Base::LocalSgd, no_gossip);
    for w in &workers[1..] {
        assert_eq!(
            w.traj, workers[0].traj,
            "the exact average is the same everywhere"
        );
    }
    workers.into_iter().next().unwrap().traj
}

#[test]
fn alpha_one_beta_zero_is_local_sgd_bit_exact() {
    let p = Problem::new(4, 1);
    for policy in [BufferPolicy::Maintain, BufferPolicy::Reset] {
        for nesterov in [false, true] {
            let run = Run {
                opt: sgd(0.9, nesterov),
                slowmo: SlowMoConfig {
                    buffer_policy: policy,
                    ..outer(4, 1.0, 0.0)
                },
                schedule: Schedule::WarmupCosine {
                    warmup: 6,
                    min_factor: 0.0,
                },
                base_lr: 0.1,
                outer_iters: 8,
            };
            let composed = compose_averaged(&p, &run);
            // Local SGD written out: local steps, then x = mean x_i.
            let mut x = p.x0();
            let mut opts: Vec<Optimizer> = (0..4)
                .map(|_| Optimizer::new(&run.opt, D).unwrap())
                .collect();
            let mut direct = vec![x.clone()];
            for t in 0..run.outer_iters {
                if policy == BufferPolicy::Reset {
                    opts.iter_mut().for_each(Optimizer::reset);
                }
                let mut xs = vec![x.clone(); 4];
                for k in 0..4 {
                    let s = t * 4 + k;
                    for i in 0..4 {
                        let g = p.grad(i, &xs[i], s);
                        opts[i].step(&mut xs[i], &g, run.lr(s));
                    }
                }
                x = mean(&xs);
                direct.push(x.clone());
            }
            assert_eq!(composed, direct, "policy {policy}, nesterov {nesterov}");
            assert_ne!(composed[0], composed[8]);
        }
    }
}

#[test]
fn tau_one_plain_sgd_is_heavy_ball_on_the_average_gradient() {
    let p = Problem::new(4, 2);
    let (alpha, beta) = (0.7f32, 0.6f32);
    let run = Run {
        opt: sgd(0.0, false),
        slowmo: outer(1, alpha, beta),
        schedule: Schedule::WarmupCosine {
            warmup: 5,
            min_factor: 0.1,
        },
        base_lr: 0.1,
        outer_iters: 40,
    };
    let composed = compose_averaged(&p, &run);
    // heavy-ball SGD, lr alpha*gamma_s, momentum beta, on the global mini-batch, in f64
    let mut x = to64(&p.x0());
    let mut buf = [0.0f64; D];
    for s in 0..run.outer_iters {
        let mut gbar = [0.0f64; D];
        for i in 0..4 {
            for (gb, g) in gbar.iter_mut().zip(p.grad64(i, &x, s)) {
                *gb += g / 4.0;
            }
        }
        let lr = alpha as f64 * run.lr(s) as f64;
        for k in 0..D {
            buf[k] = beta as f64 * buf[k] + gbar[k];
            x[k] -= lr * buf[k];
        }
        assert_close(&composed[s as usize + 1], &x, 1e-5, &format!("step {s}"));
    }
    assert!((x[0] - p.x0()[0] as f64).abs() > 1e-2, "the run must move");
}

#[test]
fn bmuf_block_momentum_with_constant_gamma() {
    let p = Problem::new(3, 3);
    let (zeta, eta) = (0.8f64, 0.5f64); // block lr alpha, block momentum beta
    let run = Run {
        opt: sgd(0.9, false),
        slowmo: outer(4, zeta as f32, eta as f32),
        schedule: Schedule::Constant,
        base_lr: 0.05,
        outer_iters: 10,
    };
    let composed = compose_averaged(&p, &run);
    let mut x0 = to64(&p.x0());
    let mut delta = [0.0f64; D];
    let mut opts: Vec<Optimizer> = (0..3)
        .map(|_| Optimizer::new(&run.opt, D).unwrap())
        .collect();
    for t in 0..run.outer_iters {
        let start: Vec<f32> = x0.iter().map(|&v| v as f32).collect();
        let mut xs = vec![start; 3];
        for k in 0..4 {
            let s = t * 4 + k;
            for i in 0..3 {
                let g = p.grad(i, &xs[i], s);
                opts[i].step(&mut xs[i], &g, run.base_lr);
            }
        }
        let avg = mean(&xs);
        for k in 0..D {
            delta[k] = eta * delta[k] + zeta * (x0[k] - avg[k] as f64);
            x0[k] -= delta[k];
        }
        assert_close(&composed[t as usize + 1], &x0, 1e-5, &format!("outer {t}"));
    }
}

#[test]
fn lookahead_single_worker() {
    let p = Problem::new(1, 4);
    let alpha = 0.5f64;
    let run = Run {
        opt: OptimizerConfig {
            kind: OptimizerKind::Adam,
            ..OptimizerConfig::default()
        },
        slowmo: outer(5, alpha as f32, 0.0),
        schedule: Schedule::Constant,
        base_lr: 0.02,
        outer_iters: 8,
    };
    let composed = compose_averaged(&p, &run);
    let mut slow = to64(&p.x0());
    let mut opt = Optimizer::new(&run.opt, D).unwrap();
    for t in 0..run.outer_iters {
        let mut fast: Vec<f32> = slow.iter().map(|&v| v as f32).collect();
        for k in 0..5 {
            let g = p.grad(0, &fast, t * 5 + k);
            opt.step(&mut fast, &g, run.base_lr);
        }
        for k in 0..D {
            slow[k] += alpha * (fast[k] as f64 - slow[k]);
        }
        assert_close(
            &composed[t as usize + 1],
            &slow,
            1e-5,
            &format!("outer {t}"),
        );
    }
}

/// Out-peers on an irregular, time-varying graph: worker i sends to
/// i + 1 + (round mod (m - 1)); worker 0 also sends to 2, so weights drift from 1.
fn irregular(m: usize, i: usize, round: u64) -> Vec<usize> {
    let mut o = vec![(i + 1 + (round as usize % (m - 1))) % m];
    if i == 0 && !o.contains(&2) {
        o.push(2);
    }
    o
}

/// One push-sum round over [`irregular`], written out over all workers.
fn gossip(ps: &mut [PushSum], round: u64) {
    let m = ps.len();
    let outs: Vec<Vec<usize>> = (0..m).map(|i| irregular(m, i, round)).collect();
    for (p, out) in ps.iter_mut().zip(&outs) {
        p.scale(1.0 / (out.len() + 1) as f64);
    }
    let shares: Vec<PushSum> = ps.to_vec();
    for (share, out) in shares.iter().zip(&outs) {
        for &j in out {
            ps[j].add_share(&share.x, share.w).unwrap();
        }
    }
}

/// Base steps of SGP for outer iteration t, written out: gradient at
/// z = x / w, base step on z, x = w * z (a step on x itself while w = 1), gossip.
fn sgp_block(p: &Problem, run: &Run, t: u64, ps: &mut [PushSum], opts: &mut [Optimizer]) {
    let tau = run.slowmo.tau;
    for k in 0..tau {
        let s = t * tau + k;
        for (i, (w, opt)) in ps.iter_mut().zip(opts.iter_mut()).enumerate() {
            let mut z = w.debiased();
            let g = p.grad(i, &z, s);
            if w.w == 1.0 {
                opt.step(&mut w.x, &g, run.lr(s));
            } else {
                opt.step(&mut z, &g, run.lr(s));
                w.set_debiased(&z);
            }
        }
        gossip(ps, s);
    }
}

#[test]
fn noaverage_each_worker_owns_anchor_and_momentum() {
    let p = Problem::new(4, 5);
    for nesterov in [false, true] {
        let run = Run {
            opt: sgd(0.5, false),
            slowmo: SlowMoConfig {
                nesterov,
                average: false,
                ..outer(3, 0.9, 0.5)
            },
            schedule: Schedule::Warmup { steps: 7 },
            base_lr: 0.1,
            outer_iters: 6,
        };
        let (alpha, beta) = (0.9f32 as f64, 0.5f64);
        let workers = run_machines(&p, &run, Base::Sgp, irregular);
        // direct
        let mut dps: Vec<PushSum> = (0..4).map(|_| PushSum::new(p.x0())).collect();
        let mut dopts: Vec<Optimizer> = (0..4)
            .map(|_| Optimizer::new(&run.opt, D).unwrap())
            .collect();
        let mut anchors: Vec<Vec<f64>> = vec![to64(&p.x0()); 4];
        let mut us = vec![vec![0.0f64; D]; 4];
        for t in 0..run.outer_iters {
            let gamma = run.gamma(t);
            sgp_block(&p, &run, t, &mut dps, &mut dopts);
            for i in 0..4 {
                let z = dps[i].debiased();
                let mut znew = vec![0.0f64; D];
                for k in 0..D {
                    let g = (anchors[i][k] - z[k] as f64) / gamma as f64;
                    us[i][k] = beta * us[i][k] + g;
                    let dir = if nesterov {
                        g + beta * us[i][k]
                    } else {
                        us[i][k]
                    };
                    znew[k] = anchors[i][k] - alpha * gamma as f64 * dir;
                }
                assert_close(
                    &workers[i].traj[t as usize + 1],
                    &znew,
                    1e-5,
                    &format!("worker {i} outer {t}"),
                );
                let z32: Vec<f32> = znew.iter().map(|&v| v as f32).collect();
                dps[i].set_debiased(&z32);
                anchors[i] = to64(&z32);
            }
        }
        for (i, w) in workers.iter().enumerate() {
            assert_close(w.machine.slowmo().momentum(), &us[i], 1e-5, "u");
        }
        let wsum: f64 = workers.iter().map(|w| w.machine.weight()).sum();
        assert!(
            (wsum - 4.0).abs() < 1e-12,
            "push-sum weight is conserved: {wsum}"
        );
        assert!(
            workers
                .iter()
                .any(|w| (w.machine.weight() - 1.0).abs() > 1e-3),
            "weights must drift from 1"
        );
        assert_ne!(
            workers[0].machine.slowmo().anchor(),
            workers[1].machine.slowmo().anchor(),
            "workers keep their own anchors"
        );
    }
}

#[test]
fn plain_sgp_outer_step_leaves_push_sum_untouched() {
    let p = Problem::new(4, 6);
    let run = Run {
        opt: sgd(0.9, true),
        slowmo: SlowMoConfig {
            average: false,
            ..outer(3, 1.0, 0.0)
        },
        schedule: Schedule::Constant,
        base_lr: 0.05,
        outer_iters: 5,
    };
    let workers = run_machines(&p, &run, Base::Sgp, irregular);
    let mut plain: Vec<PushSum> = (0..4).map(|_| PushSum::new(p.x0())).collect();
    let mut popts: Vec<Optimizer> = (0..4)
        .map(|_| Optimizer::new(&run.opt, D).unwrap())
        .collect();
    for t in 0..run.outer_iters {
        sgp_block(&p, &run, t, &mut plain, &mut popts);
    }
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(w.machine.push_sum(), &plain[i], "worker {i}");
        assert_eq!(w.machine.slowmo().anchor(), &plain[i].debiased()[..]);
        assert_eq!(
            w.machine.optimizer().state_buffers(),
            popts[i].state_buffers()
        );
    }
}
