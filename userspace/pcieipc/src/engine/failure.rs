//! The failure every rank of a communicator reports once one rank has seen it.
//!
//! The first rank to detect a dead, departed or unresponsive peer, or a
//! mismatched call, records it in the transport's shared abort record and wakes
//! everyone, so all ranks return the same error naming the same rank instead of
//! each timing out on whichever neighbour it happened to wait for.

use std::time::Duration;

use super::call::CallDescriptor;
use super::error::EngineError;
use super::fault_policy::{FaultBits, Recovery};

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
    /// Rank `rank`'s device `bdf` (in `PCIEIPC_BDF` form) reported errors the
    /// ranks cannot go on after (`fault_policy::FaultAction::Fail`).
    DeviceFault {
        rank: usize,
        bdf: u32,
        bits: FaultBits,
        recovery: Recovery,
    },
    /// Rank `rank`'s device `bdf` (in `PCIEIPC_BDF` form) was removed
    /// (`DEVICE_GONE`): hot-unplugged, unbound, or its config space reads
    /// all ones.
    DeviceRemoved {
        rank: usize,
        bdf: u32,
    },
    /// Rank `rank` read `message` (its number on `carrier`) from `peer`
    /// `reads` times and it never matched its checksum.
    DamagedMessage {
        rank: usize,
        peer: usize,
        carrier: Carrier,
        message: u32,
        reads: u32,
    },
}

/// What carried a message that arrived damaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Carrier {
    RawSlot = 0,
    RelaySlot = 1,
    OneShotWindow = 2,
}

impl Carrier {
    fn from_wire(code: u64) -> Option<Carrier> {
        [Carrier::RawSlot, Carrier::RelaySlot, Carrier::OneShotWindow]
            .into_iter()
            .find(|carrier| *carrier as u64 == code)
    }
}

impl std::fmt::Display for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Carrier::RawSlot => "raw slot",
            Carrier::RelaySlot => "relay slot",
            Carrier::OneShotWindow => "one-shot window",
        })
    }
}

impl Recovery {
    fn to_words(self) -> [u64; 2] {
        match self {
            Recovery::Recovered => [1, 0],
            Recovery::Failed => [2, 0],
            Recovery::Gone => [3, 0],
            Recovery::Unfinished { waited_ms } => [4, u64::from(waited_ms)],
            Recovery::Answering => [5, 0],
        }
    }

    fn from_words(words: [u64; 2]) -> Option<Recovery> {
        Some(match words[0] {
            1 => Recovery::Recovered,
            2 => Recovery::Failed,
            3 => Recovery::Gone,
            5 => Recovery::Answering,
            4 => Recovery::Unfinished {
                waited_ms: u32::try_from(words[1]).ok()?,
            },
            _ => return None,
        })
    }
}

/// What a peer published that no honest rank would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Corruption {
    /// A chunk size of zero or larger than the slots hold.
    ChunkSize = 1,
    /// Messages with chunk checksums where this rank checks none, or without
    /// where it checks them: `CommOptions::chunk_checksums` differs.
    ChecksumSetting = 2,
}

impl Corruption {
    fn from_wire(code: u64) -> Option<Corruption> {
        [Corruption::ChunkSize, Corruption::ChecksumSetting]
            .into_iter()
            .find(|what| *what as u64 == code)
    }
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Corruption::ChunkSize => "a chunk size its slots cannot hold",
            Corruption::ChecksumSetting => {
                "messages whose chunk checksums (present or absent) differ from this rank's \
                 setting: set chunk_checksums alike on every rank"
            }
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
            Failure::DeviceFault {
                rank,
                bdf,
                bits,
                recovery,
            } => {
                words[..6].copy_from_slice(&[
                    7,
                    rank as u64,
                    u64::from(bdf),
                    u64::from(bits.uncorrectable),
                    u64::from(bits.fatal),
                    u64::from(bits.correctable),
                ]);
                words[6..8].copy_from_slice(&recovery.to_words());
            }
            Failure::DamagedMessage {
                rank,
                peer,
                carrier,
                message,
                reads,
            } => {
                words[..6].copy_from_slice(&[
                    8,
                    rank as u64,
                    peer as u64,
                    carrier as u64,
                    u64::from(message),
                    u64::from(reads),
                ]);
            }
            Failure::DeviceRemoved { rank, bdf } => {
                words[..3].copy_from_slice(&[9, rank as u64, u64::from(bdf)]);
            }
        }
        words
    }

    /// The rank whose device this failure lost, where it lost one (removed,
    /// or given up by the kernel): that rank no longer reaches what it
    /// mapped through the device.
    pub(crate) fn lost_device_of(&self) -> Option<usize> {
        match *self {
            Failure::DeviceRemoved { rank, .. } => Some(rank),
            Failure::DeviceFault {
                rank,
                recovery: Recovery::Failed | Recovery::Gone,
                ..
            } => Some(rank),
            _ => None,
        }
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
            7 => Failure::DeviceFault {
                rank: words[1] as usize,
                bdf: u32::try_from(words[2]).ok()?,
                bits: FaultBits {
                    uncorrectable: u32::try_from(words[3]).ok()?,
                    fatal: u32::try_from(words[4]).ok()?,
                    correctable: u32::try_from(words[5]).ok()?,
                },
                recovery: Recovery::from_words([words[6], words[7]])?,
            },
            8 => Failure::DamagedMessage {
                rank: words[1] as usize,
                peer: words[2] as usize,
                carrier: Carrier::from_wire(words[3])?,
                message: u32::try_from(words[4]).ok()?,
                reads: u32::try_from(words[5]).ok()?,
            },
            9 => Failure::DeviceRemoved {
                rank: words[1] as usize,
                bdf: u32::try_from(words[2]).ok()?,
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
            Failure::DeviceFault {
                rank,
                bdf,
                bits,
                recovery,
            } => EngineError::DeviceFault {
                rank,
                device: crate::events::bdf_string(bdf),
                bits,
                recovery,
            },
            Failure::DamagedMessage {
                rank,
                peer,
                carrier,
                message,
                reads,
            } => EngineError::DamagedMessage {
                rank,
                peer,
                carrier,
                message,
                reads,
            },
            Failure::DeviceRemoved { rank, bdf } => EngineError::DeviceRemoved {
                rank,
                device: crate::events::bdf_string(bdf),
            },
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
            bypass_slots: false,
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
                peer_call: CallDescriptor {
                    count: 7,
                    chunk_bytes: 1 << 20,
                    bypass_slots: true,
                    ..call
                },
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
            Failure::DeviceFault {
                rank: 1,
                bdf: 0x0200,
                bits: FaultBits {
                    uncorrectable: 1 << 18 | 1 << 14,
                    fatal: 1 << 18,
                    correctable: 1 << 6,
                },
                recovery: Recovery::Unfinished { waited_ms: 5000 },
            },
            Failure::DeviceFault {
                rank: 0,
                bdf: 0x0001_0100,
                bits: FaultBits {
                    uncorrectable: 1 << 5,
                    fatal: 1 << 5,
                    correctable: 0,
                },
                recovery: Recovery::Recovered,
            },
            Failure::DamagedMessage {
                rank: 1,
                peer: 0,
                carrier: Carrier::RelaySlot,
                message: u32::MAX,
                reads: 5,
            },
            Failure::DeviceRemoved {
                rank: 2,
                bdf: 0x0003_0100,
            },
        ];
        for failure in failures {
            assert_eq!(Failure::from_words(failure.to_words()), Some(failure));
        }
        assert_eq!(Failure::from_words([0; FAILURE_WORDS]), None);
    }
}
