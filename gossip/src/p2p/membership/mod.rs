//! Joining a run: prove the run identity, learn the other members, agree on
//! one view.
//!
//! `/slowmo/membership/1` is a request/response exchange of small CBOR
//! messages. The dialer of a connection first knocks ([`super::admission`]):
//! both sides prove that the run's admission policy admits them, and an
//! outsider is turned away with a bare `Closed`. Admitted, the dialer sends
//! a [`Hello`] (wire version, node count, run identity and settings, its
//! addresses, the members it has verified and the member list it proposes);
//! the other side compares every field and answers [`Reply::Welcome`] with
//! its own hello, or [`Reply::Refused`] naming the field that differs (and
//! the differing settings), never a value. Both sides log a refusal; the
//! refuser's log line has both values. Member lists travel in every hello,
//! so peers that only know a bootstrap node find each other; hellos repeat
//! every 250 ms until the view is settled.
//!
//! Agreement: once `nodes` verified peers (self included) are known, a node
//! proposes the first `nodes` of them in the policy's place order (peer ids
//! when open, the allowlist's order, or a hash of run id and peer id for
//! invitations); ranks follow that order. The first member of that list
//! coordinates: the others greet only it with their proposal, and when
//! every member proposes the same list it starts the view and greets each
//! member with it (a member that hears every proposal agree starts the same
//! view itself). A view that some member has already started is adopted as
//! it is. Views are numbered; a later view may change
//! the members at a barrier, and no message format depends on the count.
//!
//! A duplicated identity (two processes with one key) is named: a
//! connection that authenticates as our own peer id, or a peer whose hellos
//! come from two live instances, ends the join with
//! [`CommError::DuplicateIdentity`] there.

pub(crate) mod handshake;
pub(crate) mod join;
pub(crate) mod msg;
