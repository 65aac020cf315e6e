//! Membership faults scripted into an in-process run: workers killed,
//! restarted, cut off by a partition and healed, at given base steps.
//!
//! ```text
//! kill 3@200; restart 3@400; partition 0-3|4-7@300..500
//! ```
//! The grammar is the run's ([`slowmo_runspec::faults`]); this board plays
//! the simulator's part of it ([`SimScript`]). The script is exact, so a
//! run replays bit for bit. The next view is decided by [`crate::view_rule::decide`], the rule the libp2p transport
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
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Handout, lock};
use crate::view_rule::{Decision, decide, has_quorum};
use crate::{Admission, CommError, NewView, ViewChange};
use slowmo_runspec::faults::{SimFault, SimScript};

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
    script: SimScript,
    timeout: Duration,
    build: Box<dyn Fn(usize) -> Vec<Handout> + Send + Sync>,
    state: Mutex<BoardState>,
    changed: Condvar,
}

impl Board {
    pub fn new(
        script: SimScript,
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
                SimFault::Kill { worker, step: s } if *s <= step => {
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
                SimFault::Partition { from, .. } if *from <= step => {
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
            if let SimFault::Kill { worker, step: s } = f
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
                if let SimFault::Kill { worker, step } = f
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
            if let SimFault::Restart { worker, step } | SimFault::Join { worker, step } = f
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
                SimFault::Kill { worker, step } if *step <= steps => {
                    lost.insert(*worker);
                    st.done.insert(i);
                }
                SimFault::Partition { sides, from, until } if *from <= steps => {
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
                SimFault::Restart { worker, step } | SimFault::Join { worker, step }
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
                return Err(CommError::RunStopped(format!(
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
        let (nv, handout) = st.built.remove(&id).ok_or_else(|| {
            CommError::Protocol(format!("worker {id} has no place in the new view"))
        })?;
        Ok((ViewChange::Member(nv), handout))
    }

    fn build_view(&self, st: &mut BoardState) -> Result<(), CommError> {
        let p = st.pending.take().expect("a change in progress");
        let reports: Vec<(usize, u64)> = p.reports.iter().map(|(w, b)| (*w, *b)).collect();
        let joiners: Vec<usize> = p.joiners.iter().copied().collect();
        let next = match decide(&st.members, &reports, &joiners, |w| *w) {
            Decision::Go(next) => next,
            Decision::NoQuorum { reachable, of } => {
                return Err(CommError::RunStopped(format!(
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
