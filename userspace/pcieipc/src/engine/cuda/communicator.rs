//! The CUDA communicator: collectives of device memory across ranks in
//! separate processes, each on a GPU of its choice (several may share one).
//! A thin façade over the types that do the work:
//!
//! - `GpuHandoff` (`gpu_handoff`): calls queued on a stream, ranks handing
//!   over through flags in each other's exchange blocks, one kernel launch
//!   per window; taken at init when every rank has a GPU of its own.
//! - `HostHandoff` (`host_handoff`): ranks meeting on the host after every
//!   step, each step a kernel over the peers' staging blocks (`staging`),
//!   or host memory where peer-to-peer is missing.
//! - `Registrations` (`registration`): user buffers peers read in place.
//! - a host `Communicator`, the control plane: every host-side exchange,
//!   liveness, timeouts, errors that name the rank.
//!
//! A call is one [`GpuCall`], queued by [`queue`](CudaCommunicator::queue)
//! (or run to completion by [`run`](CudaCommunicator::run)); `init.rs`
//! joins.

use std::sync::Arc;
use std::time::Duration;

use super::call::GpuCall;
use super::error::{on_rank, CudaError};
use super::gpu::Gpu;
use super::gpu_handoff::GpuHandoff;
use super::host_handoff::HostHandoff;
use super::host_link::{self, HostLinks};
use super::memory::DeviceBuffer;
use super::options::{CopyEnginePlan, DataPath, PeerRead};
use super::registration::Registrations;
use crate::engine::{Algorithm, CallDescriptor, Communicator, Element, EngineError};

pub struct CudaCommunicator {
    /// The GPU hand-off, when calls hand over on the GPU. Declared (so
    /// dropped) before `control`: through host memory, its blocks are
    /// registrations of the control plane's segment.
    pub(super) gpu_handoff: Option<GpuHandoff>,
    pub(super) host_handoff: HostHandoff,
    pub(super) registrations: Registrations,
    pub(super) control: Communicator,
    pub(super) gpu: Arc<Gpu>,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) path: DataPath,
    pub(super) init_time: Duration,
}

impl CudaCommunicator {
    /// Runs `call`. On the GPU hand-off it is queued on its stream (the
    /// GPU's own where it names none) and this returns at once: the result
    /// is there when the stream reaches it, nothing waits on the host, and
    /// the launches can be captured in a CUDA graph. On the host hand-off
    /// it runs after the work its stream already holds and is done when
    /// this returns. Every rank must make the same calls in the same order.
    pub fn queue(&mut self, call: GpuCall<'_>) -> Result<(), EngineError> {
        call.check(&self.gpu, self.rank, self.nranks)?;
        match &mut self.gpu_handoff {
            Some(handoff) => handoff.queue(&mut self.control, &call),
            None => self
                .host_handoff
                .run(&mut self.control, &self.registrations, &call),
        }
    }

    /// Runs `call` to completion: [`queue`](Self::queue), then on the GPU
    /// hand-off a wait (asleep) for its stream and the failure a hand-off
    /// kernel reported, if one has.
    pub fn run(&mut self, call: GpuCall<'_>) -> Result<(), EngineError> {
        let stream = call.stream.cloned();
        self.queue(call)?;
        if self.gpu_handoff.is_none() {
            return Ok(());
        }
        match stream {
            None => self.gpu.finish(),
            Some(stream) => self.gpu.finish_stream(&stream, Duration::ZERO),
        }
        .map_err(on_rank(self.rank))?;
        self.gpu_failure().map_or(Ok(()), Err)
    }

    /// Waits, asleep on a blocking-sync event, until this GPU's own stream
    /// has run every call queued on it, then reports what the hand-off
    /// kernels reported.
    pub fn wait_for_gpu(&mut self) -> Result<(), EngineError> {
        self.gpu.finish().map_err(on_rank(self.rank))?;
        self.gpu_failure().map_or(Ok(()), Err)
    }

    /// On the GPU hand-off, makes each of the next `calls` calls stamp, on
    /// the GPU, the time its last kernel ended (the GPU's global timer, ns;
    /// a call of no elements launches nothing and takes no stamp): a
    /// per-call clock for calls queued back to back, which the host cannot
    /// time and events between them blur (gpu_handoff/call_ends.rs).
    /// [`call_ends_ns`](Self::call_ends_ns) reads them; asking again
    /// before that drops the stamps so far (once their calls have run).
    /// Refused on the host hand-off, where a call returns done and the
    /// host's clock times it.
    pub fn stamp_call_ends(&mut self, calls: usize) -> Result<(), EngineError> {
        let err = on_rank(self.rank);
        match &mut self.gpu_handoff {
            Some(handoff) => handoff.stamp_call_ends(calls).map_err(err),
            None => Err(err(CudaError::NoGpuHandoff {
                ordinal: self.gpu.ordinal(),
                what: "stamping calls' ends on the GPU",
            })),
        }
    }

    /// The ends the calls since [`stamp_call_ends`](Self::stamp_call_ends)
    /// stamped, in call order, once the GPU has run them (waits for every
    /// stream of this GPU's context); stamping stops. Empty where none were
    /// asked for.
    pub fn call_ends_ns(&mut self) -> Result<Vec<u64>, EngineError> {
        match &mut self.gpu_handoff {
            Some(handoff) => handoff.take_call_ends().map_err(on_rank(self.rank)),
            None => Ok(Vec::new()),
        }
    }

    /// The error a hand-off kernel reported, if one has: every later call
    /// is refused with it.
    pub fn gpu_failure(&self) -> Option<EngineError> {
        self.gpu_handoff.as_ref()?.failure()
    }

    /// Registers `buffer` for direct peer reads: later all_reduce calls whose
    /// input it is skip the copy into staging. Collective: every rank
    /// registers its counterpart buffer, in the same order. A buffer dropped
    /// while registered stays allocated until it is deregistered (or the
    /// communicator drops), so peers never map freed or reused memory.
    pub fn register<T: Element>(&mut self, buffer: &DeviceBuffer<T>) -> Result<(), EngineError> {
        let over_peer_to_peer = self.path == DataPath::PeerToPeer;
        self.registrations
            .register(&mut self.control, &self.gpu, over_peer_to_peer, buffer)
    }

    /// Closes the peers' mappings of `buffer`. Collective, like `register`.
    pub fn deregister<T: Element>(&mut self, buffer: &DeviceBuffer<T>) -> Result<(), EngineError> {
        self.registrations.deregister(&mut self.control, buffer)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// `error`, a CUDA failure of this rank's (borrowing a caller's stream,
    /// say), as the engine reports it.
    pub fn cuda_error(&self, error: CudaError) -> EngineError {
        on_rank(self.rank)(error)
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn data_path(&self) -> &DataPath {
        &self.path
    }

    pub fn peer_read(&self) -> PeerRead {
        self.host_handoff.peer_read()
    }

    /// Whether calls hand over on the GPU.
    pub fn hands_off_on_gpu(&self) -> bool {
        self.gpu_handoff.is_some()
    }

    /// The bytes of each inbox and result slot of the GPU hand-off (rank
    /// 0's choice), `None` on the host hand-off.
    pub fn handoff_window(&self) -> Option<usize> {
        self.gpu_handoff.as_ref().map(GpuHandoff::window)
    }

    /// The thread blocks of each GPU hand-off launch (the smallest grid any
    /// rank proposed), `None` on the host hand-off.
    pub fn handoff_blocks(&self) -> Option<u32> {
        self.gpu_handoff.as_ref().map(GpuHandoff::blocks)
    }

    /// Through host memory on the GPU hand-off, which launches the copy
    /// engines move and in what chunks; `None` elsewhere, and where they
    /// move none (`copy_engines_from` never).
    pub fn copy_engine_plan(&self) -> Option<CopyEnginePlan> {
        self.gpu_handoff
            .as_ref()
            .and_then(GpuHandoff::copy_engine_plan)
    }

    /// The last call's descriptor (chunk_bytes 0 on the one-shot path,
    /// as on the host communicator).
    pub fn last_call(&self) -> Option<CallDescriptor> {
        match &self.gpu_handoff {
            Some(handoff) => handoff.last_call(),
            None => self.host_handoff.last_call(),
        }
    }

    pub fn chunk_bytes(&self) -> usize {
        self.host_handoff.chunk_bytes()
    }

    /// How long `init` took (the GPU's context creation is not in it: see
    /// [`Gpu::context_time`]).
    pub fn init_time(&self) -> Duration {
        self.init_time
    }

    /// The host control plane, for small host-side collectives alongside the
    /// device ones (timings, checks).
    pub fn control(&mut self) -> &mut Communicator {
        &mut self.control
    }

    /// Measures the link to host memory of every GPU of the job with the
    /// copy engines (`host_link::measure`, one GPU at a time), where calls go
    /// through host memory: the limit their link utilisation is taken
    /// against. `None` on the peer-to-peer path. Collective; nothing else
    /// should use the GPUs meanwhile (about 0.1 s a GPU).
    pub fn measure_host_links(&mut self) -> Result<Option<HostLinks>, EngineError> {
        if self.path == DataPath::PeerToPeer {
            return Ok(None);
        }
        host_link::measure_job(&self.gpu, &mut self.control).map(Some)
    }

    /// The bytes an all_reduce of `count` elements of `T` moves each way
    /// across this rank's GPU's link to host memory (for
    /// [`HostLinks::utilisation`]); `None` on the peer-to-peer path.
    pub fn host_link_bytes<T: Element>(&self, count: usize) -> Option<u64> {
        host_link::all_reduce_bytes_per_direction(
            &self.path,
            self.algorithm_for::<T>(count),
            self.nranks,
            count * std::mem::size_of::<T>(),
        )
    }

    /// The algorithm an all_reduce of `count` elements of `T` takes.
    pub fn algorithm_for<T: Element>(&self, count: usize) -> Algorithm {
        let bytes = count * std::mem::size_of::<T>();
        match &self.gpu_handoff {
            Some(handoff) => handoff.algorithm(bytes),
            None => self.host_handoff.algorithm(bytes, self.nranks),
        }
    }
}

impl Drop for CudaCommunicator {
    fn drop(&mut self) {
        // The control plane writes the trace when it goes, after this.
        if let (Some(handoff), Some(trace)) = (&mut self.gpu_handoff, self.control.trace()) {
            handoff.resolve_trace(trace);
        }
    }
}
