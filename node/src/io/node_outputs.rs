//! The output files of `slowmo node`: checked before the node joins, the
//! metrics written as the run goes, and at the end the parameters first,
//! then the summary, each failure reported with its path and recorded in
//! the summary (README, "Outputs and stopping").

use std::collections::HashMap;

use slowmo_runspec::{NodeSummary, RunConfig, StepRecord};

use crate::io::metrics::MetricsWriter;
use crate::io::outputs::{self, OutputErrors, OutputPaths};
use crate::model::{ParamSpec, save_params_file};

/// The parameters a node leaves at its end.
pub struct FinalParams {
    pub params: Vec<f32>,
    /// The run's averaged parameters after its last step (`false`: this
    /// node's own when it stopped).
    pub is_final: bool,
    /// Base steps behind them.
    pub steps: u64,
}

/// A node's open outputs.
pub struct NodeOutputs {
    paths: OutputPaths,
    metrics: Option<MetricsWriter>,
    /// The layout the parameter file is written in (with `--save-params`).
    saver: Option<Vec<ParamSpec>>,
    errors: OutputErrors,
}

impl NodeOutputs {
    /// Checks every path and opens the metrics file: before the node loads
    /// anything or joins the run, so that a bad path costs nobody a wait.
    pub fn open(paths: OutputPaths) -> anyhow::Result<Self> {
        paths.check()?;
        let metrics = match &paths.metrics_jsonl {
            Some(p) => Some(
                MetricsWriter::create(p)
                    .map_err(|e| anyhow::anyhow!("--metrics-jsonl {}: {e:#}", p.display()))?,
            ),
            None => None,
        };
        Ok(Self {
            paths,
            metrics,
            saver: None,
            errors: OutputErrors::default(),
        })
    }

    /// With `--save-params`: keeps the model's layout, in which the
    /// parameter file is written.
    pub fn prepare_saver(&mut self, layout: &[ParamSpec]) {
        if self.paths.save_params.is_some() {
            self.saver = Some(layout.to_vec());
        }
    }

    /// Writes one step's record. A failure is reported at once, recorded,
    /// and ends the metrics (returns `false`: the run should stop).
    pub fn record(&mut self, r: &StepRecord) -> bool {
        let Some(m) = self.metrics.as_mut() else {
            return true;
        };
        match m.write(r) {
            Ok(()) => true,
            Err(e) => {
                self.metrics = None;
                let path = self.paths.metrics_jsonl.clone().unwrap_or_default();
                self.errors
                    .note("--metrics-jsonl", &path, Err::<(), _>(e.root_cause()));
                eprintln!("stopping the run: its metrics cannot be written");
                false
            }
        }
    }

    /// The failures so far.
    pub fn errors(&self) -> &[String] {
        &self.errors.0
    }

    /// The end of the run: the parameters first, then the metrics' last
    /// flush, then the summary with every failure in `output_errors`
    /// (`completed` only when nothing failed). Returns the failures.
    pub fn finish(mut self, params: Option<FinalParams>, mut summary: NodeSummary) -> Vec<String> {
        if let (Some(path), Some(saver)) = (&self.paths.save_params, &self.saver) {
            match &params {
                Some(p) => {
                    let meta = (!p.is_final).then(|| {
                        HashMap::from([
                            ("slowmo.final".to_string(), "false".to_string()),
                            ("slowmo.steps".to_string(), p.steps.to_string()),
                        ])
                    });
                    let result = save_params_file(saver, &p.params, path, meta);
                    if result.is_ok() {
                        summary.params_final = Some(p.is_final);
                    }
                    self.errors.note("--save-params", path, result);
                }
                None => self.errors.note(
                    "--save-params",
                    path,
                    Err::<(), _>("the node stopped before it held any parameters"),
                ),
            }
        }
        if let Some(m) = self.metrics.take() {
            let path = self.paths.metrics_jsonl.clone().unwrap_or_default();
            self.errors.note("--metrics-jsonl", &path, m.finish());
        }
        summary.output_errors = self.errors.0.clone();
        if !summary.output_errors.is_empty() {
            summary.completed = false;
            summary.stopped.get_or_insert_with(|| "output error".into());
        }
        if let Some(path) = &self.paths.summary_json {
            let result = serde_json::to_vec_pretty(&summary)
                .map_err(|e| e.to_string())
                .and_then(|b| outputs::write_atomically(path, &b).map_err(|e| e.to_string()));
            self.errors.note("--summary-json", path, result);
        }
        self.errors.0
    }

    /// A summary for a node that never trained (it could not join).
    pub fn write_failed_summary(&mut self, config: &RunConfig, error: String) {
        if let Some(path) = &self.paths.summary_json {
            let result = failed_summary_bytes(config, error, None)
                .and_then(|b| outputs::write_atomically(path, &b).map_err(|e| e.to_string()));
            self.errors.note("--summary-json", path, result);
        }
    }

    /// Where the summary goes, if anywhere.
    pub fn summary_path(&self) -> Option<&std::path::Path> {
        self.paths.summary_json.as_deref()
    }
}

/// The JSON of a summary of a node that never trained.
pub fn failed_summary_bytes(
    config: &RunConfig,
    error: String,
    stopped: Option<&str>,
) -> Result<Vec<u8>, String> {
    let mut s = NodeSummary::failed(config, error);
    s.stopped = stopped.map(str::to_string);
    serde_json::to_vec_pretty(&s).map_err(|e| e.to_string())
}
