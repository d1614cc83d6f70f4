//! Where the hand-off kernels report a failure: a word of pinned host
//! memory the GPU writes and the host reads without a copy, and what it
//! says as the engine's error.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::cuda::error::CudaError;
use crate::engine::cuda::gpu::Gpu;
use crate::engine::cuda::memory::PinnedHost;
use crate::engine::{CallDescriptor, EngineError};

/// The error word's failures: `kind << 16 | detail << 8 | peer`. Kernels
/// write TIMED_OUT (detail: the phase waited in) and MISMATCHED (the peer's
/// flag came with another call: the calls are in the report); the watchdog
/// writes PEER_EXITED.
const TIMED_OUT: u32 = 1;
const PEER_EXITED: u32 = 2;
const MISMATCHED: u32 = 3;

/// What the hand-off kernels report a failure in: pinned host memory the
/// GPU writes (mapped into the device's address space) and the host reads
/// without a copy. `word` is 0 or the failure; for a mismatched call,
/// `calls` holds the peer's call and this rank's (two words each) and is
/// written before `word`.
#[repr(C)]
struct Report {
    word: u32,
    _pad: u32,
    calls: [u64; 4],
}

pub(super) struct FailureReport {
    /// Pinned host memory mapped into the GPU (`PinnedHost::mapped`),
    /// holding one `Report`; freed after the GPU's work is drained.
    pinned: PinnedHost,
    device: u64,
}

// SAFETY: the report is process-wide pinned memory that the host touches only
// through volatile reads and writes of whole words (`read`, `peer_exited`,
// `calls`); the GPU writes it too, and any value it holds is valid.
unsafe impl Send for FailureReport {}
// SAFETY: as above.
unsafe impl Sync for FailureReport {}

impl FailureReport {
    /// A zeroed report.
    pub(super) fn new(gpu: &Arc<Gpu>) -> Result<FailureReport, CudaError> {
        let (pinned, device) = PinnedHost::mapped(gpu, std::mem::size_of::<Report>())?;
        let report = FailureReport { pinned, device };
        // SAFETY: fresh, writable pinned memory of a report's size, aligned
        // for any type (cuMemHostAlloc returns page-aligned memory).
        unsafe {
            report.host().write_volatile(Report {
                word: 0,
                _pad: 0,
                calls: [0; 4],
            })
        };
        Ok(report)
    }

    fn host(&self) -> *mut Report {
        self.pinned.as_ptr().cast()
    }

    /// What the report says, as the engine's error on `rank` (`None` while
    /// nothing failed): `timeout` is the kernels' wait, `pids` every rank's.
    pub(super) fn failure(
        &self,
        rank: usize,
        timeout: Duration,
        pids: &[u32],
    ) -> Option<EngineError> {
        let word = self.read();
        if word == 0 {
            return None;
        }
        let peer = (word & 0xff) as usize;
        Some(match word >> 16 {
            MISMATCHED => {
                let [theirs_head, theirs_count, ours_head, ours_count] = self.calls();
                match (
                    CallDescriptor::from_words([ours_head, ours_count, 0]),
                    CallDescriptor::from_words([theirs_head, theirs_count, 0]),
                ) {
                    (Some(call), Some(peer_call)) => EngineError::MismatchedCall {
                        rank,
                        call,
                        peer,
                        peer_call,
                    },
                    _ => EngineError::PeerGpuFailed { rank: peer },
                }
            }
            TIMED_OUT => EngineError::PeerUnresponsive {
                rank: peer,
                waited: timeout,
            },
            PEER_EXITED => EngineError::PeerDied {
                rank: peer,
                pid: pids.get(peer).copied().unwrap_or(0),
            },
            _ => EngineError::PeerGpuFailed { rank },
        })
    }

    /// The failure word's address on the GPU.
    pub(super) fn device_address(&self) -> u64 {
        self.device
    }

    /// The calls' address on the GPU.
    pub(super) fn calls_device_address(&self) -> u64 {
        self.device + std::mem::offset_of!(Report, calls) as u64
    }

    /// Reports from the host that `peer`'s process exited (a failure the
    /// kernels then see), unless a failure is already reported.
    pub(super) fn peer_exited(&self, peer: usize) {
        if self.read() == 0 {
            // SAFETY: as in `read`; a whole-word volatile store.
            unsafe {
                (&raw mut (*self.host()).word).write_volatile(PEER_EXITED << 16 | peer as u32)
            };
        }
    }

    fn read(&self) -> u32 {
        // SAFETY: `host` is live pinned memory (freed only in drop) that the
        // GPU may write at any time: read it volatile.
        unsafe { (&raw const (*self.host()).word).read_volatile() }
    }

    /// The mismatched calls (the peer's, then this rank's), once `read`
    /// has returned a mismatch: the kernel writes them before the word.
    fn calls(&self) -> [u64; 4] {
        // SAFETY: as in `read`; whole aligned words.
        std::array::from_fn(|i| unsafe {
            (&raw const (*self.host()).calls)
                .cast::<u64>()
                .add(i)
                .read_volatile()
        })
    }
}
