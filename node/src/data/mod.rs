//! Datasets (filled in by the data work).
