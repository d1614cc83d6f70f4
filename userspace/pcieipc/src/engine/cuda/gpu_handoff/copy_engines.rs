//! A two-shot all_reduce through pinned host memory moved by the GPU's copy
//! engines: they drive the link at its rate in both directions at once
//! (about 50 GB/s each way on an H200's Gen5 x16), where the kernels' own
//! loads and stores across it reach about 28. Still no host thread in the
//! data path: flag kernels of one thread order the copies against the
//! peers' (`handoff_copies.cu`), and everything is queued on two streams of
//! the communicator's own, forked from the caller's stream and joined back
//! into it, so calls stay stream-ordered and can be captured in a graph.
//!
//! What a rank queues, and in what order, is `copy_program`'s: this file
//! turns its steps into driver calls on the communicator's streams and
//! events, at the launch's addresses, and when the job is traced brackets
//! each copy, flag kernel and reduction with timing events (a span per
//! step on its stream's track: where a launch's time goes).

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::copy_program::{self, Address, Lane, Mark, Place, Step};
use super::exchange::Blocks;
use super::plan::{CopyChunks, MAX_COPY_CHUNKS};
use crate::engine::cuda::error::CudaError;
use crate::engine::cuda::gpu::Gpu;
use crate::engine::cuda::kernels::{CopyFlag, ExchangeArg, HandoffLaunch, Kernel};
use crate::engine::cuda::memory::DeviceBuffer;
use crate::engine::cuda::options::CopyEnginePlan;
use crate::engine::cuda::tracing::KernelSpans;
use crate::trace::Arg;

/// The streams, events and device staging of a rank's copy-engine launches.
pub(super) struct CopyEngines {
    gpu: Arc<Gpu>,
    to_host: Arc<CudaStream>,
    from_host: Arc<CudaStream>,
    /// Recorded on the caller's stream: both streams start after it.
    forked: CudaEvent,
    /// Chunk c's reduction done (from-host stream): its results may leave.
    reduced: Vec<CudaEvent>,
    /// Each stream's end: the caller's stream waits for both.
    to_host_done: CudaEvent,
    from_host_done: CudaEvent,
    /// A window per rank: the peers' parts of this rank's segment.
    staging: DeviceBuffer<u8>,
    /// Which launches go by the copy engines, in what chunks.
    plan: CopyEnginePlan,
}

impl CopyEngines {
    /// Streams, events and a staging buffer of `nranks` windows, for
    /// launches and chunks as `plan` says.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        nranks: usize,
        window: usize,
        plan: CopyEnginePlan,
    ) -> Result<CopyEngines, CudaError> {
        Ok(CopyEngines {
            gpu: gpu.clone(),
            to_host: gpu.new_stream()?,
            from_host: gpu.new_stream()?,
            forked: gpu.new_event()?,
            reduced: (0..MAX_COPY_CHUNKS)
                .map(|_| gpu.new_event())
                .collect::<Result<_, _>>()?,
            to_host_done: gpu.new_event()?,
            from_host_done: gpu.new_event()?,
            staging: DeviceBuffer::zeroed(gpu, nranks * window)?,
            plan,
        })
    }

    /// Which launches go by the copy engines, in what chunks.
    pub(super) fn plan(&self) -> CopyEnginePlan {
        self.plan
    }

    /// Queues `launch` (two-shot, segments of at most `window` bytes) after
    /// the work on `stream`, which then waits for it; with `spans`, a span
    /// per step.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue(
        &self,
        kernel: &Kernel,
        launch: &HandoffLaunch,
        element: usize,
        stream: &Arc<CudaStream>,
        exchange: &ExchangeArg,
        blocks: &Blocks,
        window: usize,
        mut spans: Option<&mut KernelSpans>,
    ) -> Result<(), CudaError> {
        let (rank, nranks) = (exchange.rank as usize, exchange.nranks as usize);
        let chunks = CopyChunks::of(launch, nranks, element, self.plan.chunk_bytes);
        let lane = |lane| match lane {
            Lane::Caller => stream.as_ref(),
            Lane::ToHost => self.to_host.as_ref(),
            Lane::FromHost => self.from_host.as_ref(),
        };
        let event = |mark| match mark {
            Mark::Forked => &self.forked,
            Mark::Reduced(index) => &self.reduced[index],
            Mark::ToHostDone => &self.to_host_done,
            Mark::FromHostDone => &self.from_host_done,
        };
        let staging = self.staging.address();
        let address = |at: Address| {
            at.offset
                + match at.place {
                    Place::Input => launch.src,
                    Place::Output => launch.dst,
                    Place::Staging { peer } => staging + (peer * window) as u64,
                    Place::Inbox { at, sender } => blocks.inbox(at, sender, window),
                    Place::Results { at, owner } => blocks.results(at, owner, nranks, window),
                }
        };
        for step in copy_program::program(launch, chunks, element, rank, nranks) {
            let traced = match (spans.as_deref_mut(), step.trace_name()) {
                (Some(spans), Some(name)) => {
                    let on = step.lane();
                    Some((spans.begin(lane(on))?, on, name))
                }
                _ => None,
            };
            match step {
                Step::Record(on, mark) => self.record(event(mark), lane(on))?,
                Step::Wait(on, mark) => self.wait(lane(on), event(mark))?,
                Step::Copy {
                    lane: on,
                    to,
                    from,
                    bytes,
                } => self.copy(lane(on), address(to), address(from), bytes)?,
                Step::Flag {
                    lane: on,
                    flag,
                    phase,
                    slot,
                } => kernel.copies_flag(flag, lane(on), exchange, phase, slot)?,
                Step::Reduce {
                    lane: on,
                    offset,
                    in_slot,
                    elements,
                } => kernel.copies_reduce(
                    lane(on),
                    launch.dst + offset,
                    launch.src + offset,
                    staging + in_slot,
                    elements,
                    launch.divide_by,
                    exchange,
                )?,
            }
            if let (Some(spans), Some((start, on, name))) = (spans.as_deref_mut(), traced) {
                spans.end_step(start, lane(on), on.track(), name, step_args(&step))?;
            }
        }
        Ok(())
    }

    /// Queues a copy of `bytes` on `stream` between two addresses of the
    /// unified address space (device memory, or the registered exchange
    /// blocks: the driver tells which from the addresses).
    fn copy(&self, stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: `dst` and `src` are inside the call's buffers (the caller's
        // promise, `GpuCall`), the staging buffer or the exchange blocks, all
        // of which outlive the stream's work: the communicator drains its
        // launches before it drops them.
        unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream.cu_stream()) }
            .result()
            .map_err(self.gpu.driver("queueing a copy to or from host memory"))
    }

    fn record(&self, event: &CudaEvent, stream: &CudaStream) -> Result<(), CudaError> {
        event
            .record(stream)
            .map_err(self.gpu.driver("recording an ordering event"))
    }

    fn wait(&self, stream: &CudaStream, event: &CudaEvent) -> Result<(), CudaError> {
        stream
            .wait(event)
            .map_err(self.gpu.driver("ordering one stream after another"))
    }
}

/// A traced step's arguments: a copy's bytes and the peer at its other
/// end, a flag's phase and chunk, a reduction's elements.
fn step_args(step: &Step) -> Vec<(&'static str, Arg)> {
    match *step {
        Step::Copy { bytes, .. } => {
            let mut args = vec![("bytes", Arg::Int(bytes as i64))];
            args.extend(step.peer().map(|peer| ("peer", Arg::Int(peer as i64))));
            args
        }
        Step::Flag {
            flag: CopyFlag::Meet,
            phase,
            ..
        } => vec![("phase", Arg::Int(i64::from(phase)))],
        Step::Flag { phase, slot, .. } => vec![
            ("phase", Arg::Int(i64::from(phase))),
            ("chunk", Arg::Int(i64::from(slot))),
        ],
        Step::Reduce { elements, .. } => vec![("elements", Arg::Int(elements as i64))],
        Step::Record(..) | Step::Wait(..) => Vec::new(),
    }
}
