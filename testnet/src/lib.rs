//! Launching many slowmo nodes: local processes and docker-compose testnets,
//! fault injection, and the reports that gather what the nodes wrote.

pub mod bench;
pub mod chaos;
pub mod compose;
pub mod control;
pub mod docker;
pub mod events;
pub mod faults;
pub mod life;
pub mod local;
pub mod node_line;
pub mod observe;
pub mod outdir;
pub mod profile;
pub mod results;
pub mod yaml;
