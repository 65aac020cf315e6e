//! The one lock helper of the workspace's threaded code.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, reading through poisoning: a thread that panicked while
/// holding it leaves nothing we cannot still read (every guarded value here
/// is updated in one assignment or is a plain collection).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
