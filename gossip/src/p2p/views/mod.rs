//! View changes over libp2p: a lost member, a restarted or new node, a
//! partition (docs/algorithm.md, "Membership").
//!
//! `/slowmo/view/1` carries one small CBOR message per stream, answered by
//! an acknowledgement:
//! - [`ViewMsg::Report`]: a member of view `v` cannot go on in it (it lost a
//!   peer, or heard that another member began a change). It names the
//!   newest barrier it holds, the peers it suspects and the joiners it
//!   knows. Every member sends its report to every member it does not
//!   suspect, so a report also tells the receiver to stop and change.
//! - [`ViewMsg::Decided`]: the coordinator (the lowest-ranked member of `v`
//!   not suspected: a closed connection, or no report of its own within the
//!   peer timeout) waited for the reports of every member it does not
//!   suspect (at most the peer timeout), checked the quorum,
//!   and hands out view `v + 1`: the members that reported in their old
//!   order, then the joiners; the barrier everybody returns to (the oldest
//!   newest barrier among them); who was lost and who joined.
//! - [`ViewMsg::Excluded`]: the coordinator of a side without a quorum
//!   (less than half of `v`, or exactly half without `v`'s rank 0) tells
//!   its side to pause; they ask to join again ([`ViewMsg::Join`]) until
//!   the majority admits them at one of its barriers. Two sides therefore
//!   never both go on as the run.
//! - [`ViewMsg::Join`]: a node outside the view (new, restarted with its
//!   identity, or excluded) that passed the membership handshake asks to be
//!   admitted; the members admit it at their next barrier.
//!
//! A member a change left out is told so by the members that went on
//! ([`notice`]: an `Excluded` about the view it was left out of, repeated
//! until it can hear), so that a peer that was stopped or cut off asks to
//! join as soon as it runs again rather than after timeouts of its own.
//!
//! `/slowmo/state/1` streams the training state to a joiner: a header
//! (view, length, SHA-256) and the bytes, checked against the cap, the
//! hash and the decided view before the joiner takes them.
//!
//! The pieces: the messages ([`msg`]), the board of what was heard and the
//! loss hooks ([`board`]), the acceptors ([`accept`]), the state transfer
//! ([`transfer`]), and the communicator's side: sending ([`outbox`]), the
//! change ([`change`]), the coordinator's decision ([`decide`]), installing
//! a view ([`adopt`]) and asking to join ([`rejoin`]).

pub(crate) mod accept;
mod adopt;
pub(crate) mod board;
mod change;
mod decide;
pub(crate) mod msg;
mod notice;
mod outbox;
mod rejoin;
mod transfer;
