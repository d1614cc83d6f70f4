//! The host collectives: each algorithm as the steps `schedule` gives it,
//! moved through the communicator's slots and waits. Nothing here touches
//! shared memory by pointer or names a transport; what a transport can do
//! reaches the algorithms as `Communicator::single_copy`.

#![forbid(unsafe_code)]

mod broadcast;
mod direct;
mod one_shot;
mod ring;

use super::comm::Communicator;
use super::dtype::ReduceOp;
use crate::trace::Arg;

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

impl Communicator {
    /// Records a step that began at `traced_from` (None: not tracing):
    /// step (or round) `k` of chunk `chunk`, `bytes` from the predecessor (or, for a
    /// send, into this rank's slot). The waits inside it name the peer.
    fn trace_step(
        &self,
        name: &'static str,
        traced_from: Option<u64>,
        k: usize,
        chunk: usize,
        bytes: usize,
    ) {
        if let (Some(trace), Some(start)) = (&self.trace, traced_from) {
            trace.span(
                name,
                "step",
                start,
                vec![
                    ("step", Arg::Int(k as i64)),
                    ("chunk", Arg::Int(chunk as i64)),
                    ("bytes", Arg::Int(bytes as i64)),
                ],
            );
        }
    }
}
