//! Node summaries and the results table (filled in by the lead).
