//! The failure every rank of a communicator reports once one rank has seen it.
//!
//! The first rank to detect a dead, departed or unresponsive peer, or a
//! mismatched call, records it in the transport's shared abort record and wakes
//! everyone, so all ranks return the same error naming the same rank instead of
//! each timing out on whichever neighbour it happened to wait for.

use std::time::Duration;

use super::comm::CallDescriptor;
use super::error::EngineError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    PeerDied {
        rank: usize,
        pid: u32,
    },
    PeerLeft {
        rank: usize,
    },
    PeerUnresponsive {
        rank: usize,
        waited: Duration,
    },
    MismatchedCall {
        rank: usize,
        call: CallDescriptor,
        peer: usize,
        peer_call: CallDescriptor,
    },
    /// Rank `rank` could not read rank `owner`'s buffer (single-copy reads).
    PeerMemoryUnreadable {
        rank: usize,
        owner: usize,
        errno: i32,
    },
    /// Rank `rank` found something impossible in what `peer` published.
    PeerCorrupt {
        rank: usize,
        peer: usize,
        what: Corruption,
    },
}

/// What a peer published that no honest rank would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Corruption {
    /// A chunk size of zero or larger than the slots hold.
    ChunkSize = 1,
}

impl Corruption {
    fn from_wire(code: u64) -> Option<Corruption> {
        (code == Corruption::ChunkSize as u64).then_some(Corruption::ChunkSize)
    }
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Corruption::ChunkSize => "a chunk size its slots cannot hold",
        })
    }
}

/// Words in the shared abort record.
pub(crate) const FAILURE_WORDS: usize = 9;

impl Failure {
    pub(crate) fn to_words(self) -> [u64; FAILURE_WORDS] {
        let mut words = [0u64; FAILURE_WORDS];
        match self {
            Failure::PeerDied { rank, pid } => {
                words[..3].copy_from_slice(&[1, rank as u64, pid as u64]);
            }
            Failure::PeerLeft { rank } => {
                words[..2].copy_from_slice(&[2, rank as u64]);
            }
            Failure::PeerUnresponsive { rank, waited } => {
                words[..3].copy_from_slice(&[3, rank as u64, waited.as_millis() as u64]);
            }
            Failure::MismatchedCall {
                rank,
                call,
                peer,
                peer_call,
            } => {
                words[..3].copy_from_slice(&[4, rank as u64, peer as u64]);
                words[3..6].copy_from_slice(&call.to_words());
                words[6..9].copy_from_slice(&peer_call.to_words());
            }
            Failure::PeerMemoryUnreadable { rank, owner, errno } => {
                words[..4].copy_from_slice(&[5, rank as u64, owner as u64, errno as u64]);
            }
            Failure::PeerCorrupt { rank, peer, what } => {
                words[..4].copy_from_slice(&[6, rank as u64, peer as u64, what as u64]);
            }
        }
        words
    }

    pub(crate) fn from_words(words: [u64; FAILURE_WORDS]) -> Option<Failure> {
        let call =
            |at: usize| CallDescriptor::from_words([words[at], words[at + 1], words[at + 2]]);
        Some(match words[0] {
            1 => Failure::PeerDied {
                rank: words[1] as usize,
                pid: words[2] as u32,
            },
            2 => Failure::PeerLeft {
                rank: words[1] as usize,
            },
            3 => Failure::PeerUnresponsive {
                rank: words[1] as usize,
                waited: Duration::from_millis(words[2]),
            },
            4 => Failure::MismatchedCall {
                rank: words[1] as usize,
                peer: words[2] as usize,
                call: call(3)?,
                peer_call: call(6)?,
            },
            5 => Failure::PeerMemoryUnreadable {
                rank: words[1] as usize,
                owner: words[2] as usize,
                errno: words[3] as i32,
            },
            6 => Failure::PeerCorrupt {
                rank: words[1] as usize,
                peer: words[2] as usize,
                what: Corruption::from_wire(words[3])?,
            },
            _ => return None,
        })
    }
}

impl From<Failure> for EngineError {
    fn from(failure: Failure) -> EngineError {
        match failure {
            Failure::PeerDied { rank, pid } => EngineError::PeerDied { rank, pid },
            Failure::PeerLeft { rank } => EngineError::PeerLeft { rank },
            Failure::PeerUnresponsive { rank, waited } => {
                EngineError::PeerUnresponsive { rank, waited }
            }
            Failure::MismatchedCall {
                rank,
                call,
                peer,
                peer_call,
            } => EngineError::MismatchedCall {
                rank,
                call,
                peer,
                peer_call,
            },
            Failure::PeerMemoryUnreadable { rank, owner, errno } => {
                EngineError::PeerMemoryUnreadable { rank, owner, errno }
            }
            Failure::PeerCorrupt { rank, peer, what } => {
                EngineError::PeerCorrupt { rank, peer, what }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Algorithm, CallKind, DType, ReduceOp};

    #[test]
    fn every_failure_survives_the_shared_abort_record() {
        let call = CallDescriptor {
            kind: CallKind::AllReduce,
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            count: 1 << 20,
            root: 0,
            algorithm: Algorithm::Direct,
            chunk_bytes: 0,
        };
        let failures = [
            Failure::PeerDied { rank: 3, pid: 4242 },
            Failure::PeerLeft { rank: 1 },
            Failure::PeerUnresponsive {
                rank: 2,
                waited: Duration::from_millis(60_000),
            },
            Failure::MismatchedCall {
                rank: 0,
                call,
                peer: 5,
                peer_call: CallDescriptor { count: 7, ..call },
            },
            Failure::PeerMemoryUnreadable {
                rank: 0,
                owner: 1,
                errno: libc::EFAULT,
            },
            Failure::PeerCorrupt {
                rank: 1,
                peer: 0,
                what: Corruption::ChunkSize,
            },
        ];
        for failure in failures {
            assert_eq!(Failure::from_words(failure.to_words()), Some(failure));
        }
        assert_eq!(Failure::from_words([0; FAILURE_WORDS]), None);
    }
}
