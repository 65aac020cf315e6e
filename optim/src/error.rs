//! The one error type of the crate.
//!
//! Every message names the field or value that was wrong and what was
//! expected, so a binary can show it to a user as is (the field names are the
//! config keys, prefixed with the struct they live in).

/// The accepted textual forms of a [`crate::Schedule`], quoted by parse errors.
pub const SCHEDULE_FORMS: &str = "constant, warmup:<steps>, step:<every>:<factor>, \
     cosine, cosine:<min_factor>, warmup-cosine:<warmup>, warmup-cosine:<warmup>:<min_factor>";

/// Errors from validating configurations, parsing names and restoring state.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    /// A configuration field is outside its allowed range.
    #[error("invalid {field} = {value}: expected {expected}")]
    InvalidField {
        /// The field, e.g. `optimizer.momentum` or `slowmo.beta`.
        field: &'static str,
        /// The offending value as written.
        value: String,
        /// The allowed range, in words.
        expected: &'static str,
    },
    /// A name (optimizer, preset, base algorithm, buffer policy) is not one we know.
    #[error("unknown {what} {given:?}: expected one of {expected}")]
    UnknownName {
        /// What kind of name it is, e.g. `optimizer`.
        what: &'static str,
        /// The name as given.
        given: String,
        /// The accepted names, comma separated.
        expected: &'static str,
    },
    /// A learning-rate schedule string that does not parse or is out of range.
    #[error("invalid schedule {given:?}: {reason}; accepted forms: {SCHEDULE_FORMS}")]
    BadSchedule {
        /// The string as given.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A buffer has the wrong length (e.g. restoring a checkpoint of another model).
    #[error("{what} has length {got}, expected {expected}")]
    LengthMismatch {
        /// Which buffer, e.g. `slowmo anchor`.
        what: &'static str,
        /// The length we need.
        expected: usize,
        /// The length we got.
        got: usize,
    },
    /// A restored buffer holds NaN or infinity.
    #[error("{what} holds a non-finite value ({value}) at index {index}")]
    NonFinite {
        /// Which buffer.
        what: &'static str,
        /// The first offending index.
        index: usize,
        /// The value found there.
        value: f32,
    },
}

/// Checks that `value` lies in `[0, 1)`.
pub(crate) fn check_unit_interval(field: &'static str, value: f32) -> Result<(), OptimError> {
    if value.is_finite() && (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(OptimError::InvalidField {
            field,
            value: value.to_string(),
            expected: "a number in [0, 1)",
        })
    }
}

/// Checks that `value` is finite and `> 0`.
pub(crate) fn check_positive(field: &'static str, value: f32) -> Result<(), OptimError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(OptimError::InvalidField {
            field,
            value: value.to_string(),
            expected: "a finite number > 0",
        })
    }
}

/// Checks that `value` is finite and `>= 0`.
pub(crate) fn check_non_negative(field: &'static str, value: f32) -> Result<(), OptimError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(OptimError::InvalidField {
            field,
            value: value.to_string(),
            expected: "a finite number >= 0",
        })
    }
}

/// Checks that every element of `buf` is finite.
pub(crate) fn check_finite(what: &'static str, buf: &[f32]) -> Result<(), OptimError> {
    match buf.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(OptimError::NonFinite {
            what,
            index,
            value: buf[index],
        }),
    }
}
