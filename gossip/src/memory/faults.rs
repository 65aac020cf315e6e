//! Membership faults scripted into an in-process run: workers killed,
//! restarted, cut off by a partition and healed, at given base steps.
//!
//! ```text
//! kill 3@200; restart 3@400; partition 0-3|4-7@300..500
//! ```
//! The script is exact, so a run replays bit for bit. The next view is
//! decided by [`crate::view_rule::decide`], the rule the libp2p transport
//! calls too (docs/algorithm.md, "Membership"): the survivors keep their
//! order, joiners take the ranks after them in worker-id order.
//! - `kill W@S`: worker W dies as it begins base step S; every other member
//!   notices when it begins step S, and the live members agree on a view
//!   without W, returning to the newest barrier they all completed.
//! - `restart W@S`: W (killed earlier) asks to join again; it is admitted at
//!   the first barrier at or after step S and receives the state from the
//!   lowest-ranked member that stays.
//! - `partition A|B@S..E`: from step S the sides cannot reach each other.
//!   The side that holds a strict majority of the view goes on (with equal
//!   halves, the side holding the view's rank 0); the other side pauses and
//!   is admitted again at the first barrier at or after step E.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Handout, lock};
use crate::view_rule::{Decision, decide, has_quorum};
use crate::{Admission, CommError, NewView, ViewChange};

/// One scripted fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    Kill {
        worker: usize,
        step: u64,
    },
    Restart {
        worker: usize,
        step: u64,
    },
    /// A worker that was not there at the start (its id counts on from
    /// the run's workers) asks to join; it is admitted like a restart.
    Join {
        worker: usize,
        step: u64,
    },
    Partition {
        sides: Vec<Vec<usize>>,
        from: u64,
        until: u64,
    },
}

/// The faults of a run, in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultScript {
    pub faults: Vec<Fault>,
}

/// Most workers a script may add with `join`.
pub const MAX_JOINS: usize = 64;

fn parse_worker(text: &str, workers: usize) -> Result<usize, String> {
    let w: usize = text
        .trim()
        .parse()
        .map_err(|e| format!("worker `{text}`: {e}"))?;
    if w >= workers {
        return Err(format!("worker {w} is not below the {workers} workers"));
    }
    Ok(w)
}

fn parse_step(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|e| format!("step `{text}`: {e}"))
}

/// `0-3` or `0,2,5` or `4`.
fn parse_side(text: &str, workers: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (parse_worker(a, workers)?, parse_worker(b, workers)?);
                if a > b {
                    return Err(format!("range {a}-{b} runs backwards"));
                }
                out.extend(a..=b);
            }
            None => out.push(parse_worker(part, workers)?),
        }
    }
    Ok(out)
}

impl FaultScript {
    /// Parses `kill W@S; restart W@S; partition A|B@S..E` (statements
    /// separated by `;` or new lines) for a run of `workers`, and checks it:
    /// a restart follows a kill of the same worker, partition sides are
    /// disjoint and cover every worker, windows are not empty, no two faults
    /// overlap in a way the rules do not define.
    pub fn parse(text: &str, workers: usize) -> Result<Self, String> {
        let mut faults = Vec::new();
        for stmt in text.split([';', '\n']).map(str::trim) {
            if stmt.is_empty() || stmt.starts_with('#') {
                continue;
            }
            let (verb, rest) = stmt.split_once(char::is_whitespace).ok_or_else(|| {
                format!(
                    "`{stmt}`: expected `kill W@S`, `restart W@S`, `join W@S` or \
                     `partition A|B@S..E`"
                )
            })?;
            let (what, when) = rest
                .rsplit_once('@')
                .ok_or_else(|| format!("`{stmt}`: no `@STEP`"))?;
            let fault = match verb {
                "kill" => Fault::Kill {
                    worker: parse_worker(what, workers + MAX_JOINS)?,
                    step: parse_step(when)?,
                },
                "restart" => Fault::Restart {
                    worker: parse_worker(what, workers + MAX_JOINS)?,
                    step: parse_step(when)?,
                },
                "join" => Fault::Join {
                    worker: parse_worker(what, workers + MAX_JOINS)?,
                    step: parse_step(when)?,
                },
                "partition" => {
                    let sides = what
                        .split('|')
                        .map(|s| parse_side(s, workers))
                        .collect::<Result<Vec<_>, _>>()?;
                    let (from, until) = when
                        .split_once("..")
                        .ok_or_else(|| format!("`{stmt}`: a partition needs `@FROM..UNTIL`"))?;
                    Fault::Partition {
                        sides,
                        from: parse_step(from)?,
                        until: parse_step(until)?,
                    }
                }
                other => return Err(format!("`{stmt}`: unknown fault `{other}`")),
            };
            faults.push(fault);
        }
        let script = Self { faults };
        script.check(workers)?;
        Ok(script)
    }

    fn check(&self, workers: usize) -> Result<(), String> {
        let mut killed: HashMap<usize, u64> = HashMap::new();
        // Workers that exist so far: those of the start, then the joins.
        let mut known = workers;
        let mut joined_at: HashMap<usize, u64> = HashMap::new();
        let exists = |w: usize, known: usize| {
            if w < known {
                Ok(())
            } else {
                Err(format!(
                    "worker {w} is not below the {workers} workers (nor added by an earlier \
                     `join`)"
                ))
            }
        };
        for f in &self.faults {
            match f {
                Fault::Join { worker, step } => {
                    if *worker != known {
                        return Err(format!(
                            "join {worker}@{step}: a joining worker counts on from the \
                             {known} before it (`join {known}@...`)"
                        ));
                    }
                    known += 1;
                    joined_at.insert(*worker, *step);
                }
                Fault::Kill { worker, step } => {
                    exists(*worker, known)?;
                    if let Some(j) = joined_at.get(worker) {
                        return Err(format!(
                            "kill {worker}@{step}: worker {worker} joins at step {j}; the \
                             simulator kills only workers that were there from the start"
                        ));
                    }
                    if *step == 0 {
                        return Err(format!(
                            "kill {worker}@0: a worker dies at step 1 at the earliest"
                        ));
                    }
                    if killed.insert(*worker, *step).is_some() {
                        return Err(format!("worker {worker} is killed twice"));
                    }
                }
                Fault::Restart { worker, step } => match killed.remove(worker) {
                    _ if *worker >= known => exists(*worker, known)?,
                    Some(k) if k < *step => {}
                    _ => {
                        return Err(format!(
                            "restart {worker}@{step} needs an earlier `kill {worker}@S`"
                        ));
                    }
                },
                Fault::Partition { sides, from, until } => {
                    if from >= until || *from == 0 {
                        return Err(format!(
                            "partition window {from}..{until} is empty or starts at 0"
                        ));
                    }
                    if sides.len() != 2 {
                        return Err(format!("a partition has two sides, not {}", sides.len()));
                    }
                    let mut all: Vec<usize> = sides.concat();
                    all.sort_unstable();
                    let n = all.len();
                    all.dedup();
                    if all.len() != n || n != workers {
                        return Err(format!(
                            "partition sides must be disjoint and cover all {workers} workers"
                        ));
                    }
                }
            }
        }
        if self.faults.len() > 1
            && self
                .faults
                .iter()
                .any(|f| matches!(f, Fault::Partition { .. }))
        {
            return Err("a partition cannot be combined with other faults in one script".into());
        }
        Ok(())
    }

    /// Workers that take part from the start.
    pub fn joiners(&self) -> Vec<usize> {
        self.faults
            .iter()
            .filter_map(|f| match f {
                Fault::Restart { worker, .. } | Fault::Join { worker, .. } => Some(*worker),
                _ => None,
            })
            .collect()
    }
}

impl fmt::Display for FaultScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |s: &[usize]| {
            s.iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let parts: Vec<String> = self
            .faults
            .iter()
            .map(|x| match x {
                Fault::Kill { worker, step } => format!("kill {worker}@{step}"),
                Fault::Restart { worker, step } => format!("restart {worker}@{step}"),
                Fault::Join { worker, step } => format!("join {worker}@{step}"),
                Fault::Partition { sides, from, until } => {
                    format!(
                        "partition {}|{}@{from}..{until}",
                        side(&sides[0]),
                        side(&sides[1])
                    )
                }
            })
            .collect();
        write!(f, "{}", parts.join("; "))
    }
}

/// A change being agreed on.
struct Pending {
    /// The base step the change is for: every member that stays notices
    /// it as it begins this step (the fault's step, or the barrier that
    /// admits joiners).
    at: u64,
    /// Old members that report and stay.
    expected: BTreeSet<usize>,
    lost: BTreeSet<usize>,
    joiners: BTreeSet<usize>,
    reports: BTreeMap<usize, u64>,
}

struct BoardState {
    view: u64,
    /// Members by original worker id, in rank order (rank = index; see
    /// [`crate::view_rule::decide`] for the order).
    members: Vec<usize>,
    /// Faults already acted on (indices into the script).
    done: BTreeSet<usize>,
    /// Workers outside the view that wait to be admitted.
    waiting: BTreeSet<usize>,
    /// Workers cut off by a partition, with the step it heals.
    cut_off: BTreeMap<usize, u64>,
    pending: Option<Pending>,
    /// The latest view built: each member's place in it.
    built: HashMap<usize, (NewView, Option<Handout>)>,
    /// The state a member sent to the joiners of a view.
    state: Option<(u64, Arc<Vec<u8>>)>,
}

/// `Err` when the view went on without worker `id`.
fn still_member(st: &BoardState, id: usize) -> Result<(), CommError> {
    if st.members.contains(&id) {
        Ok(())
    } else {
        Err(CommError::ViewChanging(
            "the view went on without this worker".into(),
        ))
    }
}

/// What the workers of a faulted run share.
pub(crate) struct Board {
    script: FaultScript,
    timeout: Duration,
    build: Box<dyn Fn(usize) -> Vec<Handout> + Send + Sync>,
    state: Mutex<BoardState>,
    changed: Condvar,
}

impl Board {
    pub fn new(
        script: FaultScript,
        workers: usize,
        timeout: Duration,
        build: Box<dyn Fn(usize) -> Vec<Handout> + Send + Sync>,
    ) -> Self {
        Self {
            script,
            timeout,
            build,
            state: Mutex::new(BoardState {
                view: 0,
                members: (0..workers).collect(),
                done: BTreeSet::new(),
                waiting: BTreeSet::new(),
                cut_off: BTreeMap::new(),
                pending: None,
                built: HashMap::new(),
                state: None,
            }),
            changed: Condvar::new(),
        }
    }

    /// Worker `id` begins base step `step`: it dies here, or learns that a
    /// member died or a partition began.
    pub fn base_step(&self, id: usize, step: u64, restarted: bool) -> Result<(), CommError> {
        let st = lock(&self.state);
        // A killed worker dies whether or not the others noticed already.
        self.check_killed(id, step, restarted)?;
        still_member(&st, id)?;
        // A change a faster member began is noticed at the step it is for,
        // not earlier: the step every member leaves at is the same on
        // every replay.
        if let Some(p) = st.pending.as_ref().filter(|p| !p.lost.is_empty())
            && step >= p.at
        {
            return Err(CommError::ViewChanging(format!(
                "another member began a view change at step {}",
                p.at
            )));
        }
        for (i, f) in self.script.faults.iter().enumerate() {
            if st.done.contains(&i) {
                continue;
            }
            match f {
                Fault::Kill { worker, step: s } if *s <= step => {
                    if *worker == id {
                        return Err(CommError::Closed(format!(
                            "worker {id} killed by the fault script at step {s}"
                        )));
                    }
                    if st.members.contains(worker) {
                        return Err(CommError::PeerLost {
                            peer: format!("worker-{worker}"),
                            rank: st.members.iter().position(|m| m == worker).unwrap_or(0),
                            reason: format!("killed by the fault script at step {s}"),
                        });
                    }
                }
                Fault::Partition { from, .. } if *from <= step => {
                    return Err(CommError::ViewChanging(format!(
                        "a partition began at step {from}"
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `Err` when the script killed worker `id` at or before `step` (and it
    /// is not its restarted incarnation).
    fn check_killed(&self, id: usize, step: u64, restarted: bool) -> Result<(), CommError> {
        for f in &self.script.faults {
            if let Fault::Kill { worker, step: s } = f
                && *worker == id
                && *s <= step
                && !restarted
            {
                return Err(CommError::Closed(format!(
                    "worker {id} killed by the fault script at step {s}"
                )));
            }
        }
        Ok(())
    }

    /// Whether a wait goes on: a worker that is no longer a member (the
    /// view went on without it) gives up. A change another member began
    /// does not end a wait: a change is for a step S, every member (the
    /// one that dies at S too) completes every step before S, so what a
    /// wait before S needs comes, and the member leaves at S (see
    /// [`Board::base_step`]).
    ///
    /// A killed worker's first incarnation (`restarted` false) gives up
    /// once the view went on without it, even if its restarted incarnation
    /// is a member again by the time it looks.
    pub fn check_pending(&self, id: usize, restarted: bool) -> Result<(), CommError> {
        let st = lock(&self.state);
        if !restarted {
            for (i, f) in self.script.faults.iter().enumerate() {
                // (While the change that loses it is still agreed on, it
                // computes on to its step: the others may wait for its
                // shares of the steps before.)
                if let Fault::Kill { worker, step } = f
                    && *worker == id
                    && st.done.contains(&i)
                    && !st.pending.as_ref().is_some_and(|p| p.lost.contains(&id))
                {
                    return Err(CommError::Closed(format!(
                        "worker {id} killed by the fault script at step {step}"
                    )));
                }
            }
        }
        still_member(&st, id)
    }

    /// After the barrier that ends base step `steps - 1`: whether joiners
    /// are admitted here.
    pub fn at_barrier(&self, steps: u64) -> bool {
        let st = lock(&self.state);
        // A change for a later step (a kill a faster member met) is joined
        // at that step, not here.
        st.pending.as_ref().is_some_and(|p| p.at <= steps)
            || !self.admissible(&st, steps).is_empty()
    }

    /// Workers admitted at a barrier after `steps` base steps.
    fn admissible(&self, st: &BoardState, steps: u64) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        for (i, f) in self.script.faults.iter().enumerate() {
            if let Fault::Restart { worker, step } | Fault::Join { worker, step } = f
                && !st.done.contains(&i)
                && *step <= steps
                && !st.members.contains(worker)
            {
                out.insert(*worker);
            }
        }
        for (w, heal) in &st.cut_off {
            if *heal <= steps {
                out.insert(*w);
            }
        }
        out
    }

    /// The change the first reporter of a view change sets up, from the
    /// script: who is lost, who is cut off, who joins.
    fn plan(&self, st: &mut BoardState, steps: u64) -> Pending {
        let mut lost = BTreeSet::new();
        let mut joiners = BTreeSet::new();
        for (i, f) in self.script.faults.iter().enumerate() {
            if st.done.contains(&i) {
                continue;
            }
            match f {
                Fault::Kill { worker, step } if *step <= steps => {
                    lost.insert(*worker);
                    st.done.insert(i);
                }
                Fault::Partition { sides, from, until } if *from <= steps => {
                    // The sides cover every worker, so exactly one holds
                    // the quorum of the view; the other pauses.
                    let live = |side: &Vec<usize>| -> Vec<usize> {
                        st.members
                            .iter()
                            .copied()
                            .filter(|w| side.contains(w))
                            .collect()
                    };
                    let keep = usize::from(!has_quorum(&st.members, &live(&sides[0])));
                    for w in &sides[1 - keep] {
                        if st.members.contains(w) {
                            lost.insert(*w);
                            st.cut_off.insert(*w, *until);
                        }
                    }
                    st.done.insert(i);
                }
                Fault::Restart { worker, step } | Fault::Join { worker, step }
                    if *step <= steps && !st.members.contains(worker) =>
                {
                    joiners.insert(*worker);
                    st.done.insert(i);
                }
                _ => {}
            }
        }
        let healed: Vec<usize> = st
            .cut_off
            .iter()
            .filter(|(_, heal)| **heal <= steps)
            .map(|(w, _)| *w)
            .collect();
        for w in healed {
            st.cut_off.remove(&w);
            joiners.insert(w);
        }
        let expected = st
            .members
            .iter()
            .copied()
            .filter(|w| !lost.contains(w))
            .collect();
        Pending {
            at: steps,
            expected,
            lost,
            joiners,
            reports: BTreeMap::new(),
        }
    }

    fn wait<'a>(
        &self,
        mut st: std::sync::MutexGuard<'a, BoardState>,
        started: Instant,
        what: &str,
        done: impl Fn(&BoardState) -> bool,
    ) -> Result<std::sync::MutexGuard<'a, BoardState>, CommError> {
        while !done(&st) {
            let left = (started + self.timeout).saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CommError::Other(format!(
                    "the simulated membership change timed out after {:?} waiting for {what}",
                    self.timeout
                )));
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(st)
    }

    /// Worker `id` (a member, `steps` base steps done, newest barrier
    /// `last_barrier`) reports for the view change.
    pub fn change_view(
        &self,
        id: usize,
        steps: u64,
        last_barrier: u64,
        restarted: bool,
    ) -> Result<(ViewChange, Option<Handout>), CommError> {
        let started = Instant::now();
        // A killed worker that was still waiting when the others went on
        // dies here (it waits one step short of its kill).
        self.check_killed(id, steps + 1, restarted)?;
        let mut st = lock(&self.state);
        if !st.members.contains(&id) && !st.cut_off.contains_key(&id) {
            // Outside the view and not cut off by a partition: the script
            // killed it and the others went on before it reached its step.
            return Err(CommError::Closed(format!(
                "worker {id} killed by the fault script"
            )));
        }
        if !st.members.contains(&id) {
            return Ok((
                ViewChange::Excluded("not a member of the view".into()),
                None,
            ));
        }
        if st.pending.is_none() {
            let plan = self.plan(&mut st, steps);
            st.pending = Some(plan);
        }
        if st.pending.as_ref().is_some_and(|p| p.lost.contains(&id)) {
            let Some(heal) = st.cut_off.get(&id) else {
                // The script kills it: it dies now rather than later.
                return Err(CommError::Closed(format!(
                    "worker {id} killed by the fault script"
                )));
            };
            let why = format!("cut off by a partition until step {heal}");
            return Ok((ViewChange::Excluded(why), None));
        }
        let pending = st.pending.as_mut().expect("set above");
        pending.reports.insert(id, last_barrier);
        let complete = pending.reports.len() == pending.expected.len();
        let view = st.view;
        if complete {
            // The joiners must be waiting before the view is handed out.
            let joiners = st.pending.as_ref().expect("set above").joiners.clone();
            st = self.wait(st, started, "joiners", |s| joiners.is_subset(&s.waiting))?;
            let built = self.build_view(&mut st);
            self.changed.notify_all();
            built?;
        } else {
            st = self.wait(st, started, "the other members' reports", |s| s.view > view)?;
        }
        let (nv, handout) = st
            .built
            .remove(&id)
            .ok_or_else(|| CommError::Other(format!("worker {id} has no place in the new view")))?;
        Ok((ViewChange::Member(nv), handout))
    }

    fn build_view(&self, st: &mut BoardState) -> Result<(), CommError> {
        let p = st.pending.take().expect("a change in progress");
        let reports: Vec<(usize, u64)> = p.reports.iter().map(|(w, b)| (*w, *b)).collect();
        let joiners: Vec<usize> = p.joiners.iter().copied().collect();
        let next = match decide(&st.members, &reports, &joiners, |w| *w) {
            Decision::Go(next) => next,
            Decision::NoQuorum { reachable, of } => {
                return Err(CommError::Other(format!(
                    "the fault script leaves {reachable} of {of} workers in no side with a \
                     quorum"
                )));
            }
        };
        let name = |w: &usize| format!("worker-{w}");
        let names = |ws: &[usize]| ws.iter().map(name).collect::<Vec<_>>();
        let mut handouts = (self.build)(next.members.len()).into_iter();
        st.view += 1;
        st.built.clear();
        for (rank, w) in next.members.iter().enumerate() {
            let nv = NewView {
                number: st.view,
                rank,
                world: next.members.len(),
                rollback_to: next.rollback_to,
                lost: names(&next.lost),
                joined: names(&next.joined),
                sends_state: next.state_sender == Some(rank),
                members: names(&next.members),
                state_sender: next.state_sender,
            };
            st.built.insert(*w, (nv, handouts.next()));
        }
        for w in &next.joined {
            st.waiting.remove(w);
        }
        st.members = next.members;
        Ok(())
    }

    /// Rank 0 of a view with joiners hands over the state.
    pub fn send_state(&self, bytes: &[u8]) {
        let mut st = lock(&self.state);
        st.state = Some((st.view, Arc::new(bytes.to_vec())));
        self.changed.notify_all();
    }

    /// Worker `id` waits outside the view until it is admitted.
    pub fn rejoin(&self, id: usize) -> Result<(Admission, Option<Handout>), CommError> {
        let mut st = lock(&self.state);
        st.waiting.insert(id);
        self.changed.notify_all();
        // Outside the view nothing times out: a partition may last long.
        loop {
            if let Some((nv, _)) = st.built.get(&id) {
                let number = nv.number;
                if st.state.as_ref().is_some_and(|(v, _)| *v == number) {
                    break;
                }
            }
            st = self
                .changed
                .wait_timeout(st, Duration::from_secs(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let (view, handout) = st.built.remove(&id).expect("checked above");
        let state = st.state.as_ref().expect("checked above").1.to_vec();
        Ok((Admission { view, state }, handout))
    }
}
