//! Launching many slowmo nodes.
