//! What one collective call is, as every rank must agree on it. Each rank
//! publishes its descriptor before the call moves data; a peer that finds a
//! different one reports both (see [`super::EngineError::MismatchedCall`]).

use std::fmt;

use crate::engine::dtype::{DType, ReduceOp};
use crate::engine::schedule::Algorithm;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CallKind {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Broadcast = 4,
}

impl CallKind {
    pub fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce => "all_reduce",
            CallKind::ReduceScatter => "reduce_scatter",
            CallKind::AllGather => "all_gather",
            CallKind::Broadcast => "broadcast",
        }
    }

    fn from_wire(code: u8) -> Option<CallKind> {
        [
            CallKind::AllReduce,
            CallKind::ReduceScatter,
            CallKind::AllGather,
            CallKind::Broadcast,
        ]
        .into_iter()
        .find(|kind| *kind as u8 == code)
    }
}

/// One rank's view of a collective call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDescriptor {
    pub kind: CallKind,
    pub dtype: DType,
    /// `None` for the calls that do not reduce (all_gather, broadcast).
    pub op: Option<ReduceOp>,
    /// Elements per rank buffer as the call defines it: the whole buffer for
    /// all_reduce and broadcast, the per-rank share for reduce_scatter and all_gather.
    pub count: u64,
    /// The broadcast root; 0 for the other calls.
    pub root: u32,
    pub algorithm: Algorithm,
    /// The chunk size the ring or broadcast moves the call in, decided by one
    /// rank for all (docs/engine.md); 0 for the one-shot and direct paths, and while a
    /// broadcast rank has yet to learn it from the message it receives.
    pub chunk_bytes: u32,
    /// Whether the ring fills its slots past the cache below the streaming
    /// threshold, decided by the same rank as the chunk from the calls it
    /// measured (`slot_fill`); false for the other paths.
    pub bypass_slots: bool,
}

impl CallDescriptor {
    /// Whether `other` is the same call as far as the user chose it (all but
    /// the chunk size and slot fill, which ranks adopt from the rank that
    /// decides them).
    pub fn same_call(&self, other: &CallDescriptor) -> bool {
        CallDescriptor {
            chunk_bytes: other.chunk_bytes,
            bypass_slots: other.bypass_slots,
            ..*self
        } == *other
    }

    /// The descriptor as three words for the transport's shared control block.
    pub(crate) fn to_words(self) -> [u64; 3] {
        let head = self.kind as u64
            | (self.dtype as u64) << 8
            | (self.op.map_or(0, |op| op as u64)) << 16
            | (self.algorithm as u64) << 24
            | (self.root as u64) << 32;
        let decided = self.chunk_bytes as u64 | u64::from(self.bypass_slots) << 32;
        [head, self.count, decided]
    }

    /// Decodes words a peer published; `None` if they are not a descriptor
    /// (only possible when the peer's memory was corrupted).
    pub(crate) fn from_words(words: [u64; 3]) -> Option<CallDescriptor> {
        let [head, count, decided] = words;
        let op_code = (head >> 16) as u8;
        let bypass_slots = match decided >> 32 {
            0 => false,
            1 => true,
            _ => return None,
        };
        Some(CallDescriptor {
            kind: CallKind::from_wire(head as u8)?,
            dtype: DType::from_wire((head >> 8) as u8)?,
            op: if op_code == 0 {
                None
            } else {
                Some(ReduceOp::from_wire(op_code)?)
            },
            algorithm: Algorithm::from_wire((head >> 24) as u8)?,
            root: (head >> 32) as u32,
            count,
            chunk_bytes: decided as u32,
            bypass_slots,
        })
    }
}

impl fmt::Display for CallDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(count={}, {}",
            self.kind.name(),
            self.count,
            self.dtype
        )?;
        if let Some(op) = self.op {
            write!(f, ", {op}")?;
        }
        if self.kind == CallKind::Broadcast {
            write!(f, ", root={}", self.root)?;
        }
        write!(f, "; {}", self.algorithm.name())?;
        if self.chunk_bytes != 0 {
            write!(f, ", {}-byte chunks", self.chunk_bytes)?;
        }
        write!(f, ")")
    }
}
