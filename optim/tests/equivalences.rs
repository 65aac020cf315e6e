//! The outer loop end to end: `Optimizer` + `SlowMo` (+ `PushSum`) composed as
//! the training loop composes them, on a small least-squares problem with m
//! workers simulated by plain loops, checked against direct implementations of
//! the special cases in ALGORITHMS.md (Local SGD, heavy-ball SGD, BMUF,
//! Lookahead, the noaverage variant over push-sum gossip).
//!
//! Per outer iteration: apply the buffer policy; tau base steps per worker;
//! exact average (unless noaverage); outer step with gamma = lr at the barrier step.

use slowmo_optim::{
    BufferPolicy, Optimizer, OptimizerConfig, OptimizerKind, PushSum, Rng, Schedule, SlowMo,
    SlowMoConfig,
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

fn apply_policy(policy: BufferPolicy, opts: &mut [Optimizer]) {
    match policy {
        BufferPolicy::Maintain => {}
        BufferPolicy::Reset => opts.iter_mut().for_each(Optimizer::reset),
        BufferPolicy::Average => {
            for b in 0..opts[0].state_buffers().len() {
                let bufs: Vec<Vec<f32>> =
                    opts.iter().map(|o| o.state_buffers()[b].to_vec()).collect();
                let avg = mean(&bufs);
                for o in opts.iter_mut() {
                    o.state_buffers_mut()[b].copy_from_slice(&avg);
                }
            }
        }
    }
}

/// The loop with an exact average and no gossip (Local SGD base); returns x_{t,0}, t = 0..=T.
fn compose_averaged(p: &Problem, run: &Run) -> Vec<Vec<f32>> {
    let (m, tau) = (p.m(), run.slowmo.tau);
    let mut x = p.x0();
    let mut slow = SlowMo::try_new(run.slowmo.clone(), &x).unwrap();
    let mut opts: Vec<Optimizer> = (0..m)
        .map(|_| Optimizer::new(&run.opt, D).unwrap())
        .collect();
    let mut traj = vec![x.clone()];
    for t in 0..run.outer_iters {
        apply_policy(run.slowmo.buffer_policy, &mut opts);
        let mut xs = vec![x.clone(); m];
        for k in 0..tau {
            let s = t * tau + k;
            for (i, (xi, opt)) in xs.iter_mut().zip(opts.iter_mut()).enumerate() {
                let g = p.grad(i, xi, s);
                opt.step(xi, &g, run.lr(s));
            }
        }
        x = mean(&xs);
        slow.outer_step(&mut x, run.gamma(t));
        traj.push(x.clone());
    }
    traj
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

/// One push-sum round on an irregular, time-varying graph: worker i sends to
/// i + 1 + (round mod (m - 1)); worker 0 also sends to 2, so weights drift from 1.
fn gossip(ps: &mut [PushSum], round: u64) {
    let m = ps.len();
    let outs: Vec<Vec<usize>> = (0..m)
        .map(|i| {
            let mut o = vec![(i + 1 + (round as usize % (m - 1))) % m];
            if i == 0 && !o.contains(&2) {
                o.push(2);
            }
            o
        })
        .collect();
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

/// Base steps of SGP for outer iteration t: gradient at z = x / w, step on x, gossip.
fn sgp_block(p: &Problem, run: &Run, t: u64, ps: &mut [PushSum], opts: &mut [Optimizer]) {
    let tau = run.slowmo.tau;
    for k in 0..tau {
        let s = t * tau + k;
        for (i, (w, opt)) in ps.iter_mut().zip(opts.iter_mut()).enumerate() {
            let g = p.grad(i, &w.debiased(), s);
            opt.step(&mut w.x, &g, run.lr(s));
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
        let new_opts = || -> Vec<Optimizer> {
            (0..4)
                .map(|_| Optimizer::new(&run.opt, D).unwrap())
                .collect()
        };
        // composed
        let mut ps: Vec<PushSum> = (0..4).map(|_| PushSum::new(p.x0())).collect();
        let mut opts = new_opts();
        let mut slows: Vec<SlowMo> = (0..4)
            .map(|_| SlowMo::new(run.slowmo.clone(), &p.x0()))
            .collect();
        // direct
        let mut dps = ps.clone();
        let mut dopts = new_opts();
        let mut anchors: Vec<Vec<f64>> = vec![to64(&p.x0()); 4];
        let mut us = vec![vec![0.0f64; D]; 4];
        for t in 0..run.outer_iters {
            let gamma = run.gamma(t);
            sgp_block(&p, &run, t, &mut ps, &mut opts);
            for (w, slow) in ps.iter_mut().zip(slows.iter_mut()) {
                slow.outer_step_push_sum(w, gamma);
            }
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
                    &ps[i].debiased(),
                    &znew,
                    1e-5,
                    &format!("worker {i} outer {t}"),
                );
                assert_close(slows[i].momentum(), &us[i], 1e-5, "u");
                let z32: Vec<f32> = znew.iter().map(|&v| v as f32).collect();
                dps[i].set_debiased(&z32);
                anchors[i] = to64(&z32);
            }
            let wsum: f64 = ps.iter().map(|w| w.w).sum();
            assert!(
                (wsum - 4.0).abs() < 1e-12,
                "push-sum weight is conserved: {wsum}"
            );
        }
        assert!(
            ps.iter().any(|w| (w.w - 1.0).abs() > 1e-3),
            "weights must drift from 1"
        );
        assert_ne!(
            slows[0].anchor(),
            slows[1].anchor(),
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
    let mut ps: Vec<PushSum> = (0..4).map(|_| PushSum::new(p.x0())).collect();
    let mut opts: Vec<Optimizer> = (0..4)
        .map(|_| Optimizer::new(&run.opt, D).unwrap())
        .collect();
    let mut slows: Vec<SlowMo> = (0..4)
        .map(|_| SlowMo::new(run.slowmo.clone(), &p.x0()))
        .collect();
    let mut plain = ps.clone();
    let mut popts = opts.clone();
    for t in 0..run.outer_iters {
        sgp_block(&p, &run, t, &mut ps, &mut opts);
        for (w, slow) in ps.iter_mut().zip(slows.iter_mut()) {
            slow.outer_step_push_sum(w, run.gamma(t));
            assert_eq!(slow.anchor(), &w.debiased()[..]);
        }
        sgp_block(&p, &run, t, &mut plain, &mut popts);
        assert_eq!(ps, plain, "outer {t}");
    }
}
