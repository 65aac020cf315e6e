//! Warnings about what peers send, rate-limited: a flood of garbage (a
//! port scanner on the lane port, a misbehaving peer) must not flood the
//! log. Each kind of warning is logged at most once per [`WINDOW`]; the
//! ones held back are counted, and the next one logged says how many.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::lock;

/// At most one warning of a kind per this long.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// See the [module docs](self).
#[derive(Default)]
pub(crate) struct Throttle {
    /// By kind: when one was last logged, and how many were held back since.
    kinds: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Throttle {
    /// Whether a warning of `kind` may be logged now: `Some(note)` (empty,
    /// or saying how many were held back since the last one), or `None`.
    pub(crate) fn admit(&self, kind: &str) -> Option<String> {
        self.admit_at(kind, Instant::now())
    }

    fn admit_at(&self, kind: &str, now: Instant) -> Option<String> {
        let mut kinds = lock(&self.kinds);
        match kinds.get_mut(kind) {
            Some((last, held)) if now.duration_since(*last) < WINDOW => {
                *held += 1;
                None
            }
            Some((last, held)) => {
                let note = match *held {
                    0 => String::new(),
                    n => format!(
                        " ({n} more like it in the {:.0?} before were not logged)",
                        now.duration_since(*last)
                    ),
                };
                *last = now;
                *held = 0;
                Some(note)
            }
            None => {
                kinds.insert(kind.to_string(), (now, 0));
                Some(String::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_kind_and_window_and_the_rest_are_counted() {
        let t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.admit_at("lane", t0).as_deref(), Some(""));
        for i in 1..=99 {
            assert_eq!(t.admit_at("lane", t0 + Duration::from_millis(i)), None);
        }
        // Another kind is not held back by this one.
        assert_eq!(t.admit_at("knock", t0).as_deref(), Some(""));
        let later = t.admit_at("lane", t0 + WINDOW).unwrap();
        assert!(later.contains("99 more like it"), "{later}");
        assert_eq!(
            t.admit_at("lane", t0 + 2 * WINDOW + WINDOW).as_deref(),
            Some("")
        );
    }
}
