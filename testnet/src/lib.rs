//! Launching many slowmo nodes: local processes and docker-compose testnets,
//! fault injection, and the reports that gather what the nodes wrote.

pub mod local;
pub mod summary;
