//! `slowmo topology` (filled in by the topology work).
