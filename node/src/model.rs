//! Models (filled in by the model work).
