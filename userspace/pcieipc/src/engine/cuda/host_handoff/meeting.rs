//! Where the host hand-off's ranks meet: after queueing a step a rank waits
//! for its GPU (polling a completion event, then asleep on it) and then
//! meets its peers in an 8-byte all_reduce on the host control plane. No
//! kernel ever waits on a peer: ranks sharing a GPU are time-sliced, so a
//! kernel polling for its peer's write could hold the very GPU the peer
//! needs.

use std::time::Duration;

use crate::engine::cuda::agreement::highest_failing_rank;
use crate::engine::cuda::error::{on_rank, CudaError};
use crate::engine::cuda::gpu::Gpu;
use crate::engine::{Communicator, EngineError};
use crate::trace::monotonic_ns;

/// A rank's GPU and its control plane, for the waits of one call.
pub(super) struct Meeting<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) control: &'a mut Communicator,
    /// How long a wait for the GPU polls before it sleeps.
    pub(super) poll: Duration,
}

impl Meeting<'_> {
    /// Waits for this rank's GPU to run what is queued (polling, then
    /// asleep): a "GPU event" wait in the trace.
    pub(super) fn finish_gpu(&self) -> Result<(), CudaError> {
        let traced_from = self.control.trace().map(|_| monotonic_ns());
        let outcome = self.gpu.finish_after_polling(self.poll);
        if let (Some(trace), Some(start)) = (self.control.trace(), traced_from) {
            trace.span("GPU event", "wait", start, []);
        }
        outcome
    }

    /// Waits (asleep) for this rank's queued GPU work, then meets every peer
    /// on the host. A rank whose GPU work failed still comes to the meeting,
    /// so its peers learn it at once instead of timing out.
    pub(super) fn barrier(&mut self, queued: Result<(), CudaError>) -> Result<(), EngineError> {
        let local = queued.and_then(|()| self.finish_gpu());
        let failing = highest_failing_rank(self.control, local.is_err())?;
        local.map_err(on_rank(self.control.rank()))?;
        match failing {
            None => Ok(()),
            Some(rank) => Err(EngineError::PeerGpuFailed { rank }),
        }
    }
}
