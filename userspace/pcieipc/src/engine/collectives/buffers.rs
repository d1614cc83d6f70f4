//! What a host collective is handed: the call's buffers, and for the ring
//! which collective it runs.

use crate::engine::dtype::ReduceOp;

/// The buffers of one call. In place, the rank's own contribution is read from
/// the same memory the result is written to.
pub(crate) enum Buffers<'a, T> {
    InPlace(&'a mut [T]),
    OutOfPlace { input: &'a [T], output: &'a mut [T] },
}

impl<T> Buffers<'_, T> {
    pub(crate) fn input(&self) -> &[T] {
        match self {
            Buffers::InPlace(buffer) => buffer,
            Buffers::OutOfPlace { input, .. } => input,
        }
    }

    /// The bytes the call reads and writes on this rank: its input, and its
    /// output when that is other memory.
    pub(crate) fn bytes_touched(&self) -> usize {
        match self {
            Buffers::InPlace(buffer) => std::mem::size_of_val(*buffer),
            Buffers::OutOfPlace { input, output } => {
                std::mem::size_of_val(*input) + std::mem::size_of_val(*output)
            }
        }
    }

    pub(crate) fn output(&mut self) -> &mut [T] {
        match self {
            Buffers::InPlace(buffer) => buffer,
            Buffers::OutOfPlace { output, .. } => output,
        }
    }
}

/// Which ring collective, with its reduction.
#[derive(Clone, Copy)]
pub(crate) enum RingCall {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
}
