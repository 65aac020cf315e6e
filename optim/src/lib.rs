//! The math of slowmo (filled in by the optim work).
