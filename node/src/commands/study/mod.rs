//! `slowmo study paper`: the paper's comparison with error bars. Every base
//! (Local SGD, SGP, OSGP, AR-SGD, Local Adam) runs in the simulator without
//! slow momentum and with each slow momentum of a small grid, over several
//! seeds and models; the grid's beta is chosen per model and base by the
//! mean accuracy on a validation split held out of the training set, and
//! only the chosen beta's test accuracy is reported.
//!
//! Each run is one [`Simulation`] on a dataset in memory
//! ([`Simulation::dataset`]): the training set minus the validation split; its folder (`runs/KEY/`: `metrics.jsonl`,
//! `summary.json`, `report.html`, `result.json`) is a simulate output that
//! `slowmo report` reads. A run whose `result.json` exists is not run again,
//! so an interrupted study resumes where it stopped.

mod args;
mod page;
mod paper;
mod table;

pub use args::{PaperArgs, StudyArgs, StudyBase, StudyCommand};
pub use paper::{hold_out, run, run_paper, variants};
pub use table::{
    Aggregate, Comparison, RunResult, Settings, StudyTable, Variant, choose_beta, mean_std,
    tabulate,
};
