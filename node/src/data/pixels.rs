//! The values of a split, stored as compactly as their source allows.
//!
//! Image files hold one byte per value, and normalising a byte gives one of
//! 256 values per channel. [`Pixels::Bytes`] keeps the bytes and a table of
//! those values per channel, and decodes a range when a batch is made: a
//! quarter of the memory of f32 values (Fashion-MNIST: 55 MB instead of
//! 220 MB in every node), and exactly the values an f32 copy would hold,
//! since the table entries are computed with the same expression.
//! Synthetic data has no bytes behind it and stays [`Pixels::Values`].

use std::borrow::Cow;

/// One value per byte for each channel.
pub type Table = [f32; 256];

/// A split's values, sample after sample (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub enum Pixels {
    /// The values themselves.
    Values(Vec<f32>),
    /// One byte per value; value `k` is `tables[(k / plane) % tables.len()]
    /// [bytes[k]]` (one table per channel of `plane` values, channels in
    /// order within a sample).
    Bytes {
        bytes: Vec<u8>,
        tables: Vec<Table>,
        plane: usize,
    },
}

impl Default for Pixels {
    fn default() -> Self {
        Pixels::Values(Vec::new())
    }
}

impl From<Vec<f32>> for Pixels {
    fn from(values: Vec<f32>) -> Self {
        Pixels::Values(values)
    }
}

impl Pixels {
    /// Bytes read through one table per channel; `plane` values per channel
    /// within a sample (any positive number when there is one table).
    pub fn bytes(tables: Vec<Table>, plane: usize) -> Self {
        assert!(!tables.is_empty() && plane > 0, "a byte table and a plane");
        Pixels::Bytes {
            bytes: Vec::new(),
            tables,
            plane,
        }
    }

    /// The table of `f(byte)` for every byte.
    pub fn table(f: impl Fn(u8) -> f32) -> Table {
        std::array::from_fn(|b| f(b as u8))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Pixels::Values(v) => v.len(),
            Pixels::Bytes { bytes, .. } => bytes.len(),
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends raw bytes (a `Bytes` store only).
    pub fn extend_bytes(&mut self, more: &[u8]) {
        match self {
            Pixels::Bytes { bytes, .. } => bytes.extend_from_slice(more),
            Pixels::Values(_) => panic!("bytes appended to a store of values"),
        }
    }

    /// Appends values `start..end` to `out`.
    ///
    /// # Panics
    /// When the range is out of bounds, as slicing does.
    pub fn extend_into(&self, start: usize, end: usize, out: &mut Vec<f32>) {
        match self {
            Pixels::Values(v) => out.extend_from_slice(&v[start..end]),
            Pixels::Bytes {
                bytes,
                tables,
                plane,
            } => {
                let src = &bytes[start..end];
                if let [table] = tables.as_slice() {
                    out.extend(src.iter().map(|&b| table[usize::from(b)]));
                } else {
                    out.extend(src.iter().enumerate().map(|(i, &b)| {
                        tables[((start + i) / plane) % tables.len()][usize::from(b)]
                    }));
                }
            }
        }
    }

    /// Values `start..end`, borrowed when stored as values, or `None` when
    /// out of range.
    pub fn get(&self, start: usize, end: usize) -> Option<Cow<'_, [f32]>> {
        if start > end || end > self.len() {
            return None;
        }
        Some(match self {
            Pixels::Values(v) => Cow::Borrowed(&v[start..end]),
            Pixels::Bytes { .. } => {
                let mut out = Vec::with_capacity(end - start);
                self.extend_into(start, end, &mut out);
                Cow::Owned(out)
            }
        })
    }

    /// Every value, decoded.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_into(0, self.len(), &mut out);
        out
    }

    /// The values of `ranges` (whole samples: a byte's table follows from
    /// its place), one after the other, in the same kind of store (bytes
    /// stay bytes).
    ///
    /// # Panics
    /// When a range is out of bounds, as slicing does.
    pub fn gather(&self, ranges: impl IntoIterator<Item = std::ops::Range<usize>>) -> Pixels {
        match self {
            Pixels::Values(v) => {
                Pixels::Values(ranges.into_iter().flat_map(|r| &v[r]).copied().collect())
            }
            Pixels::Bytes {
                bytes,
                tables,
                plane,
            } => Pixels::Bytes {
                bytes: ranges
                    .into_iter()
                    .flat_map(|r| &bytes[r])
                    .copied()
                    .collect(),
                tables: tables.clone(),
                plane: *plane,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_decode_through_the_table_of_their_channel() {
        let tables = vec![Pixels::table(f32::from), Pixels::table(|b| -f32::from(b))];
        let mut p = Pixels::bytes(tables, 2);
        // two samples of two channels of two values each
        p.extend_bytes(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(p.len(), 8);
        assert_eq!(p.to_vec(), vec![1.0, 2.0, -3.0, -4.0, 5.0, 6.0, -7.0, -8.0]);
        assert_eq!(p.get(3, 6).unwrap().as_ref(), &[-4.0, 5.0, 6.0]);
        assert!(p.get(7, 9).is_none());
        // whole samples, the second first
        let picked = p.gather([4..8, 0..4]);
        assert!(matches!(picked, Pixels::Bytes { .. }));
        assert_eq!(
            picked.to_vec(),
            vec![5.0, 6.0, -7.0, -8.0, 1.0, 2.0, -3.0, -4.0]
        );
        let v = Pixels::from(vec![0.5, 1.5]);
        assert!(matches!(v.get(1, 2), Some(Cow::Borrowed(&[1.5]))));
    }
}
