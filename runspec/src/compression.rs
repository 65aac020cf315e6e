//! How push-sum shares are compressed on the wire (`--compress`): the
//! codecs themselves live in `slowmo_gossip::compress`.

use std::fmt;
use std::str::FromStr;

/// A push-sum share's wire encoding. The push-sum weight always travels
/// exactly; only the numerator `x` is compressed, and its sender keeps the
/// compression error (see docs/algorithm.md, "Compressed gossip").
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Compression {
    /// Plain `f32`.
    #[default]
    None,
    /// bfloat16, rounded to nearest even: 2x fewer bytes.
    Bf16,
    /// Block-scaled int8 (an `f32` scale per 256 values): 3.9x fewer bytes.
    Int8,
    /// The given fraction of the values with the largest magnitude, with
    /// their indices: `1 / (2 F)` fewer bytes.
    TopK(f32),
}

impl Compression {
    /// Whether shares go uncompressed.
    pub fn is_none(&self) -> bool {
        *self == Compression::None
    }
}

/// An unparsable `--compress` value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "invalid compression {input:?}: {reason}; expected none, bf16, int8 or topk:<F> with 0 < F <= 1"
)]
pub struct CompressionError {
    /// The value as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Bf16 => f.write_str("bf16"),
            Compression::Int8 => f.write_str("int8"),
            Compression::TopK(k) => write!(f, "topk:{k}"),
        }
    }
}

impl FromStr for Compression {
    type Err = CompressionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| CompressionError {
            input: s.to_string(),
            reason,
        };
        match s {
            "none" => Ok(Compression::None),
            "bf16" => Ok(Compression::Bf16),
            "int8" => Ok(Compression::Int8),
            _ => {
                let f = s.strip_prefix("topk:").ok_or_else(|| bad("unknown name"))?;
                let f: f32 = f.parse().map_err(|_| bad("the fraction is not a number"))?;
                if f.is_finite() && f > 0.0 && f <= 1.0 {
                    Ok(Compression::TopK(f))
                } else {
                    Err(bad("the fraction must be in (0, 1]"))
                }
            }
        }
    }
}

impl TryFrom<String> for Compression {
    type Error = CompressionError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Compression> for String {
    fn from(c: Compression) -> String {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        for c in [
            Compression::None,
            Compression::Bf16,
            Compression::Int8,
            Compression::TopK(0.01),
            Compression::TopK(1.0),
        ] {
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<Compression>(&json).unwrap(), c);
        }
        for bad in [
            "int4",
            "topk:",
            "topk:0",
            "topk:1.5",
            "topk:nan",
            "topk:-0.1",
        ] {
            let e = bad.parse::<Compression>().unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("topk:<F>"), "{e}");
        }
    }
}
