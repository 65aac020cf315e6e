//! The messages of `/slowmo/view/1` and `/slowmo/state/1`, the checks a
//! decision passes, and the timings of the view protocol.

use std::collections::HashSet;
use std::time::Duration;

use libp2p::PeerId;
use serde::{Deserialize, Serialize};

use crate::p2p::membership::msg::MemberInfo;

/// Protocol of view changes and joins.
pub(crate) const VIEW_PROTOCOL: &str = "/slowmo/view/1";
/// Protocol of the state transfer to joiners.
pub(crate) const STATE_PROTOCOL: &str = "/slowmo/state/1";

/// Time for one view message to be delivered and acknowledged.
pub(super) const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the training thread looks at the board while it waits.
pub(super) const TICK: Duration = Duration::from_millis(20);
/// How often a joiner repeats its request.
pub(super) const JOIN_REPEAT: Duration = Duration::from_secs(2);
/// Most members a view message may list.
pub(super) const MAX_MEMBERS: usize = 4096;

/// A member's account of why view `view` must end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Report {
    pub view: u64,
    pub last_barrier: u64,
    pub suspects: Vec<String>,
    pub joiners: Vec<MemberInfo>,
    /// Collectives the sender completed in `view`: a member that completed
    /// fewer finishes the collective it is in before it changes (see
    /// `Shared::raise_after`).
    #[serde(default)]
    pub collectives: u64,
}

/// The next view, as its coordinator decided it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ViewDecision {
    pub from_view: u64,
    pub number: u64,
    /// Members in rank order, with the addresses joiners dial.
    pub members: Vec<MemberInfo>,
    pub rollback_to: u64,
    pub lost: Vec<String>,
    pub joined: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ViewMsg {
    Report(Report),
    Decided(ViewDecision),
    Excluded {
        view: u64,
        reason: String,
    },
    /// The run cannot go on (fewer members than `--min-nodes` and nobody
    /// joined in time): every member stops with the reason.
    Stop {
        view: u64,
        reason: String,
    },
    Join {
        addrs: Vec<String>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ViewReply {
    Ok,
    Refused(String),
    /// The answer to a join request from a peer the current view already
    /// admitted: the decision, again (the first may have been lost while
    /// the connection to its earlier process was dropped).
    Admitted(ViewDecision),
}

/// The header of a state transfer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StateHeader {
    pub view: u64,
    pub len: u64,
    pub sha256: String,
}

pub(super) fn parse_peer(text: &str) -> Result<PeerId, String> {
    text.parse()
        .map_err(|e| format!("`{text}` is not a peer id: {e}"))
}

pub(super) fn check_decision(d: &ViewDecision) -> Result<(), String> {
    if d.members.is_empty() || d.members.len() > MAX_MEMBERS {
        return Err(format!("decision with {} members", d.members.len()));
    }
    if d.number != d.from_view + 1 {
        return Err(format!(
            "decision of view {} after view {}",
            d.number, d.from_view
        ));
    }
    let mut seen = HashSet::new();
    for m in &d.members {
        parse_peer(&m.peer)?;
        if !seen.insert(&m.peer) {
            return Err(format!("decision lists {} twice", m.peer));
        }
        if m.addrs.len() > 64 {
            return Err("decision with too many addresses".into());
        }
    }
    for p in d.lost.iter().chain(&d.joined) {
        parse_peer(p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<PeerId> {
        (0..n).map(|_| PeerId::random()).collect()
    }

    #[test]
    fn decisions_are_checked() {
        let p = peers(2);
        let good = ViewDecision {
            from_view: 3,
            number: 4,
            members: p
                .iter()
                .map(|p| MemberInfo {
                    peer: p.to_string(),
                    addrs: vec![],
                })
                .collect(),
            rollback_to: 2,
            lost: vec![],
            joined: vec![],
        };
        assert!(check_decision(&good).is_ok());
        let skip = ViewDecision {
            number: 6,
            ..good.clone()
        };
        assert!(check_decision(&skip).unwrap_err().contains("after view 3"));
        let mut twice = good.clone();
        twice.members.push(twice.members[0].clone());
        assert!(check_decision(&twice).unwrap_err().contains("twice"));
        let mut bad = good.clone();
        bad.members[1].peer = "not-a-peer".into();
        assert!(check_decision(&bad).unwrap_err().contains("not a peer id"));
        let empty = ViewDecision {
            members: vec![],
            ..good
        };
        assert!(check_decision(&empty).is_err());
    }
}
