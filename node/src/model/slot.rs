//! A parameter tensor before its place in the flat buffer is known: the
//! architectures (`arch.rs`, `transformer.rs`) list these, `Model` lays them
//! out and initialises them.

/// How one parameter tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    /// Uniform in `±bound`.
    Uniform(f32),
    /// Normal with mean 0 and this standard deviation.
    Normal(f32),
    /// Every value the same.
    Constant(f32),
}

impl Init {
    /// PyTorch's default for a layer with `fan_in` inputs: uniform in
    /// `±1/sqrt(fan_in)`.
    pub fn fan_in(fan_in: usize) -> Self {
        Init::Uniform(1.0 / (fan_in as f32).sqrt())
    }
}

/// One parameter tensor before offsets are assigned: name, shape, init.
pub(crate) type Slot = (String, Vec<usize>, Init);
