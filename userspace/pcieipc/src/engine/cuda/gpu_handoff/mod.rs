//! Collectives with the hand-off on the GPU: one kernel launch per window on
//! the caller's stream, no host meeting per call or per step, so calls can
//! sit on a training loop's stream, overlap compute, and be captured in a
//! CUDA graph.
//!
//! Every rank owns an exchange block: flags, then inboxes and result slots
//! for two parities. On the peer-to-peer path it is device memory,
//! IPC-exported and opened by every peer at init; without peer-to-peer it is
//! the rank's backend area of the control plane's shared segment, which every
//! rank pins and maps into its GPU (`cuMemHostRegister`), so the same kernels
//! write and read it over PCIe, as NCCL's shared-memory transport does, with
//! no host thread in the data path. A rank
//! pushes its data into its peers' blocks and then raises its flag there
//! (system-scope fence, release store of the launch's epoch); it waits on the
//! flags in its own block (acquire loads). Each kernel block counts its
//! launches in a counter in its device memory, not in a kernel argument, so a
//! replayed CUDA graph keeps counting; every rank makes the same launches in
//! the same order, so the epochs agree and no flag is ever reset. The parity
//! of the epoch picks the slots, and launch k + 2 writes a peer's slots only
//! after seeing that peer's flags of launch k + 1, which the peer raises only
//! once launch k, the last to read them, has ended (one stream orders a
//! rank's launches). Only plain stores cross the link: PCIe has no peer
//! atomics.
//!
//! Through host memory, two-shot launches of 4 MiB and more move by
//! the GPU's copy engines instead (`copy_engines`), which drive the link at
//! its rate both ways at once; the kernels' loads and stores reach about
//! half of it, and start sooner for small messages. A small message takes
//! few blocks (`plan::grid`): each block's flags are a round trip.
//!
//! Every wait is bounded: a block that sees no flag within the timeout
//! writes what it waited for into a host-mapped error word and ends the
//! kernel; the communicator then refuses every later call with that error.
//! Every flag carries the call it was raised for, so ranks that call
//! differently are told so at once, with both calls.
//! The kernels spin on each other, so the grid is small enough to be
//! resident on every GPU, and ranks sharing one GPU do not use this path by
//! default (time-sliced contexts make every hand-off wait for a time slice).
//!
//! - `exchange`: the blocks (device memory or pinned shared host memory).
//! - `plan`: what a call launches, from `schedule`.
//! - `copy_program`: what a rank queues for a launch by the copy engines,
//!   checked in a model of streams and flags; `copy_engines` queues it.
//! - `report`: where kernels report a failure, and what it says.
//! - `watchdog`: a peer's exit written into that report.
//! - `call_ends`: each call's end stamped on the GPU, for a per-call clock.

mod call_ends;
mod copy_engines;
mod copy_program;
mod exchange;
mod plan;
mod report;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream};

pub(crate) use exchange::ExchangeMemory;
pub(super) use plan::{DEFAULT_COPY_CHUNK_BYTES, DEFAULT_COPY_ENGINES_FROM};

use super::call::GpuCall;
use super::error::{on_rank, CudaError, BACKEND};
use super::gpu::Gpu;
use super::kernels::{ExchangeArg, HANDOFF_BLOCKS};
use super::memory::DeviceBuffer;
use super::options::CopyEnginePlan;
use super::tracing::KernelSpans;
use crate::engine::schedule::Limits;
use crate::engine::transport::PeerWatch;
use crate::engine::{
    Algorithm, AlgorithmChoice, CallDescriptor, CallKind, Communicator, EngineError,
};
use crate::trace::{Arg, Recorder};
use call_ends::CallEnds;
use copy_engines::CopyEngines;
use exchange::Blocks;
use report::FailureReport;
use watchdog::Watchdog;

/// What a GPU hand-off is opened with (rank 0's choices where ranks must
/// agree).
pub(super) struct HandoffSettings {
    pub(super) memory: ExchangeMemory,
    /// Bytes of one inbox or result slot.
    pub(super) window: usize,
    /// The grid of every launch.
    pub(super) blocks: u32,
    /// How long a kernel waits for a peer's flag.
    pub(super) timeout: Duration,
    pub(super) algorithm: AlgorithmChoice,
    /// The one-shot budget (bytes of a one-shot message).
    pub(super) one_shot_bytes: usize,
    /// Through host memory: which launches the copy engines move, and in
    /// what chunks.
    pub(super) copy_engines: CopyEnginePlan,
}

/// A rank's side of the GPU hand-off: the exchange blocks and the state of
/// the calls so far.
pub(super) struct GpuHandoff {
    gpu: Arc<Gpu>,
    rank: usize,
    nranks: usize,
    blocks_memory: Blocks,
    /// Each kernel block's launch counter (`HANDOFF_BLOCKS` words), then
    /// the epoch at which the last copy-engine launch ended.
    epochs: DeviceBuffer<i64>,
    /// Bytes of one inbox or result slot (rank 0's choice).
    window: usize,
    /// The most blocks a launch takes (rank 0's choice: the flags are per
    /// block).
    blocks: u32,
    /// Through host memory: the copy engines' streams, staging and plan.
    copies: Option<CopyEngines>,
    timeout: Duration,
    report: Arc<FailureReport>,
    /// Every rank's pid, to name a peer that exited.
    pids: Vec<u32>,
    _watchdog: Watchdog,
    /// Orders this communicator's launches when callers change streams.
    ordering: CudaEvent,
    last_stream: Option<Arc<CudaStream>>,
    algorithm: AlgorithmChoice,
    limits: Limits,
    /// The kernels of each call, when tracing.
    spans: Option<KernelSpans>,
    /// Where calls stamp their ends, when asked (`stamp_call_ends`).
    call_ends: Option<CallEnds>,
    last_call: Option<CallDescriptor>,
}

impl GpuHandoff {
    /// Bytes of a rank's exchange block.
    pub(super) fn bytes(nranks: usize, window: usize) -> usize {
        Blocks::bytes(nranks, window)
    }

    /// The one-shot budget per message for rank 0's `one_shot_read_budget`
    /// on this path (`plan::one_shot_bytes`).
    pub(super) fn one_shot_bytes(
        budget: Option<usize>,
        through_host: bool,
        nranks: usize,
    ) -> usize {
        plan::one_shot_bytes(budget, through_host, nranks)
    }

    /// The grid a rank proposes: at most one block per multiprocessor, so
    /// that every block of a launch is resident while it spins.
    pub(super) fn proposed_blocks(gpu: &Gpu) -> u32 {
        gpu.multiprocessors().min(HANDOFF_BLOCKS as u32)
    }

    /// Sets up the exchange blocks and the watchdog (collective: every rank
    /// calls it at init when calls hand over on the GPU, then agrees on the
    /// outcome, which is also the barrier that keeps peers from writing into
    /// a block before it is zeroed and mapped).
    pub(super) fn open(
        gpu: &Arc<Gpu>,
        control: &mut Communicator,
        settings: HandoffSettings,
    ) -> Result<GpuHandoff, EngineError> {
        let (rank, nranks) = (control.rank(), control.nranks());
        let err = on_rank(rank);
        let bytes = Blocks::bytes(nranks, settings.window);
        let blocks_memory = Blocks::open(settings.memory, gpu, control, bytes)?;
        let epochs = DeviceBuffer::<i64>::zeroed(gpu, HANDOFF_BLOCKS + 1).map_err(&err)?;
        let copies = match settings.memory {
            ExchangeMemory::Host => Some(
                CopyEngines::new(gpu, nranks, settings.window, settings.copy_engines)
                    .map_err(&err)?,
            ),
            ExchangeMemory::Device => None,
        };
        let report = Arc::new(FailureReport::new(gpu).map_err(&err)?);
        let ordering = gpu.new_event().map_err(&err)?;
        let pids = control.pids();
        let watch = PeerWatch::open(rank, pids.clone()).map_err(EngineError::from)?;
        let watchdog = Watchdog::start(watch, report.clone())
            .map_err(|source| EngineError::transport(rank, BACKEND, source))?;
        Ok(GpuHandoff {
            gpu: gpu.clone(),
            rank,
            nranks,
            blocks_memory,
            epochs,
            window: settings.window,
            blocks: settings.blocks,
            copies,
            timeout: settings.timeout,
            report,
            pids,
            _watchdog: watchdog,
            ordering,
            last_stream: None,
            algorithm: settings.algorithm,
            limits: plan::limits(settings.one_shot_bytes, settings.window, nranks),
            spans: control.trace().map(|_| KernelSpans::new(gpu.clone())),
            call_ends: None,
            last_call: None,
        })
    }

    /// The bytes of each inbox and result slot.
    pub(super) fn window(&self) -> usize {
        self.window
    }

    /// The most thread blocks a launch takes.
    pub(super) fn blocks(&self) -> u32 {
        self.blocks
    }

    /// Which launches the copy engines move, and in what chunks (through
    /// host memory, unless they move none).
    pub(super) fn copy_engine_plan(&self) -> Option<CopyEnginePlan> {
        let plan = self.copies.as_ref()?.plan();
        (plan.from_bytes != usize::MAX).then_some(plan)
    }

    /// The last call's descriptor.
    pub(super) fn last_call(&self) -> Option<CallDescriptor> {
        self.last_call
    }

    /// The error a hand-off kernel (or the watchdog) reported, if one has:
    /// every later call is refused with it.
    pub(super) fn failure(&self) -> Option<EngineError> {
        self.report.failure(self.rank, self.timeout, &self.pids)
    }

    /// The algorithm an all_reduce of `bytes` takes.
    pub(super) fn algorithm(&self, bytes: usize) -> Algorithm {
        plan::algorithm(
            CallKind::AllReduce,
            bytes,
            self.nranks,
            self.algorithm,
            &self.limits,
        )
    }

    /// Queues `call` (checked by the communicator) on its stream, one launch
    /// per piece `plan` gives, and returns at once. Refused once a kernel
    /// has reported a failure, or when a fault on the followed device failed
    /// the job (`control` acts on those per call, as on the host
    /// transports).
    pub(super) fn queue(
        &mut self,
        control: &mut Communicator,
        call: &GpuCall,
    ) -> Result<(), EngineError> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        control.follow_faults()?;
        let err = on_rank(self.rank);
        let algorithm = plan::algorithm(
            call.kind,
            call.bytes(),
            self.nranks,
            self.algorithm,
            &self.limits,
        );
        let descriptor = call.descriptor(algorithm, 0);
        self.last_call = Some(descriptor);
        if call.count == 0 {
            return Ok(());
        }
        let kernel = self.gpu.kernel(call.dtype, call.op).map_err(&err)?;
        let stream = call.stream_of(&self.gpu).clone();
        self.order_after_last_call(&stream).map_err(&err)?;
        let call_end = self.call_ends.as_mut().map_or(0, CallEnds::next_call);
        let argument = self.argument(descriptor, call_end);
        let traced = match &mut self.spans {
            Some(spans) => Some(spans.begin(&stream).map_err(&err)?),
            None => None,
        };
        // Each launch reads and writes what `call` holds: the typed
        // constructors' buffers, or the raw call's promise (`GpuCall`).
        let element = call.dtype.size_bytes();
        for launch in plan::launches(call, algorithm, self.nranks, self.window) {
            match &self.copies {
                Some(copies)
                    if plan::by_copy_engines(&launch, element, copies.plan().from_bytes) =>
                {
                    copies.queue(
                        &kernel,
                        &launch,
                        element,
                        &stream,
                        &argument,
                        &self.blocks_memory,
                        self.window,
                        self.spans.as_mut(),
                    )
                }
                _ => {
                    let grid = plan::grid(&launch, element, self.blocks);
                    kernel.handoff(&launch, &stream, grid, &argument)
                }
            }
            .map_err(&err)?;
        }
        if let (Some(spans), Some(start)) = (&mut self.spans, traced) {
            spans
                .end(
                    start,
                    &stream,
                    call.kind.name(),
                    vec![
                        ("dtype", Arg::Text(call.dtype.name())),
                        ("count", Arg::Int(call.count as i64)),
                        ("algorithm", Arg::Text(algorithm.name())),
                        ("blocks", Arg::Int(i64::from(self.blocks))),
                    ],
                )
                .map_err(&err)?;
        }
        Ok(())
    }

    /// Makes each of the next `calls` calls that launch anything (a call
    /// of no elements launches nothing) stamp its end on the GPU's clock,
    /// read back by [`take_call_ends`](Self::take_call_ends).
    pub(super) fn stamp_call_ends(&mut self, calls: usize) -> Result<(), CudaError> {
        if self.call_ends.is_some() {
            // Calls queued under the stamps before may still write them:
            // they are freed only once those calls have run.
            self.gpu.synchronize()?;
        }
        self.call_ends = Some(CallEnds::new(&self.gpu, calls)?);
        Ok(())
    }

    /// The ends the calls since `stamp_call_ends` stamped (ns of the GPU's
    /// global timer), once the GPU has run every stream's work; stamping
    /// stops. Empty where none were asked for.
    pub(super) fn take_call_ends(&mut self) -> Result<Vec<u64>, CudaError> {
        let Some(ends) = self.call_ends.take() else {
            return Ok(Vec::new());
        };
        self.gpu.synchronize()?;
        ends.read()
    }

    /// The exchange as the kernels take it, for the call `descriptor`,
    /// whose end is stamped at `call_end` (0: not stamped).
    fn argument(&self, descriptor: CallDescriptor, call_end: u64) -> ExchangeArg {
        let [call_head, call_count, _] = descriptor.to_words();
        ExchangeArg {
            base: std::array::from_fn(|rank| {
                if rank < self.blocks_memory.count() {
                    self.blocks_memory.address(rank)
                } else {
                    0
                }
            }),
            window: self.window as u64,
            rank: self.rank as u32,
            nranks: self.nranks as u32,
            timeout_ns: self.timeout.as_nanos() as u64,
            error: self.report.device_address(),
            epochs: self.epochs.address(),
            call: [call_head, call_count],
            calls: self.report.calls_device_address(),
            call_end,
        }
    }

    /// A call on another stream than the last one waits for the last one's
    /// launches: the parity argument needs one rank's launches in order.
    fn order_after_last_call(&mut self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        if let Some(last) = &self.last_stream {
            self.gpu.order(&self.ordering, last, stream)?;
        }
        self.last_stream = Some(stream.clone());
        Ok(())
    }

    /// Turns the traced calls into kernel spans of `recorder` (waits for the
    /// GPU).
    pub(super) fn resolve_trace(&mut self, recorder: &Recorder) {
        if let Some(spans) = &mut self.spans {
            spans.resolve(recorder);
        }
    }
}

impl Drop for GpuHandoff {
    fn drop(&mut self) {
        // Launches on any stream may still use the blocks and the error word
        // (a kernel waiting for a peer that left ends at its timeout).
        let _ = self.gpu.synchronize();
    }
}
