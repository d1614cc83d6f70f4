//! A two-shot all_reduce through pinned host memory moved by the GPU's copy
//! engines: they drive the link at its rate in both directions at once
//! (about 50 GB/s each way on an H200's Gen5 x16), where the kernels' own
//! loads and stores across it reach about 28. Still no host thread in the
//! data path: flag kernels of one thread order the copies against the
//! peers' (`handoff_copies.cu`), and everything is queued on two streams of
//! the communicator's own, forked from the caller's stream and joined back
//! into it, so calls stay stream-ordered and can be captured in a graph.
//!
//! Per chunk of a launch (`plan::CopyChunks`), rank r:
//! - to the host (one stream): r's part of each owner's segment into that
//!   owner's inbox, then flag 0 of the chunk; later, once the chunk of r's
//!   own segment is reduced, the result into every peer's result slot, then
//!   flag 1;
//! - from the host (the other): wait for every peer's flag 0, their parts
//!   of r's segment into device staging, reduce into r's output; wait for
//!   every peer's flag 1, their results into r's output.
//!
//! So the chunk after a chunk is pushed while that one is pulled and
//! reduced: both directions of the link are busy. The copies take fixed
//! slots (the host cannot know the launch's parity, which the GPU counts),
//! so the ranks meet at the start and the end of a launch: no peer is still
//! reading a slot from the launch before, or about to read one of this.

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::exchange::Blocks;
use super::plan::{CopyChunks, MAX_COPY_CHUNKS};
use crate::engine::cuda::error::CudaError;
use crate::engine::cuda::gpu::Gpu;
use crate::engine::cuda::kernels::{CopyFlag, ExchangeArg, HandoffLaunch, Kernel};
use crate::engine::cuda::memory::DeviceBuffer;

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
}

/// One launch's geometry, as the copies address it.
struct Geometry<'a> {
    launch: &'a HandoffLaunch,
    chunks: CopyChunks,
    element: usize,
    rank: usize,
    nranks: usize,
}

impl Geometry<'_> {
    /// Chunk `index` of `rank`'s segment: its byte offset in the launch's
    /// buffers, its byte offset in that segment's slot, and its bytes.
    fn chunk(&self, rank: usize, index: usize) -> (u64, u64, usize) {
        let range = self.chunks.chunk(self.launch, rank, index);
        let in_segment = range.start - self.launch.segments.start[rank] as usize;
        (
            (range.start * self.element) as u64,
            (in_segment * self.element) as u64,
            range.len() * self.element,
        )
    }

    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nranks).filter(|&peer| peer != self.rank)
    }
}

impl CopyEngines {
    /// Streams, events and a staging buffer of `nranks` windows.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        nranks: usize,
        window: usize,
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
        })
    }

    /// Queues `launch` (two-shot, segments of at most `window` bytes) after
    /// the work on `stream`, which then waits for it.
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
    ) -> Result<(), CudaError> {
        let (rank, nranks) = (exchange.rank as usize, exchange.nranks as usize);
        let geometry = Geometry {
            launch,
            chunks: CopyChunks::of(launch, nranks, element),
            element,
            rank,
            nranks,
        };
        let (to_host, from_host) = (&self.to_host, &self.from_host);
        self.record(&self.forked, stream)?;
        self.wait(to_host, &self.forked)?;
        self.wait(from_host, &self.forked)?;
        kernel.copies_flag(CopyFlag::Meet, to_host, exchange, 0, 0)?;
        let count = geometry.chunks.count;
        // Pushes: r's part of each owner's segment into the owner's inbox.
        for index in 0..count {
            for owner in geometry.peers() {
                let (offset, in_slot, bytes) = geometry.chunk(owner, index);
                let inbox = blocks.inbox(owner, rank, window) + in_slot;
                self.copy(to_host, inbox, launch.src + offset, bytes)?;
            }
            kernel.copies_flag(CopyFlag::Signal, to_host, exchange, 0, index as u32)?;
        }
        // Pulls and reductions of r's own segment.
        let staging = self.staging.address();
        for index in 0..count {
            kernel.copies_flag(CopyFlag::Await, from_host, exchange, 0, index as u32)?;
            let (offset, in_slot, bytes) = geometry.chunk(rank, index);
            for peer in geometry.peers() {
                let staged = staging + (peer * window) as u64 + in_slot;
                self.copy(
                    from_host,
                    staged,
                    blocks.inbox(rank, peer, window) + in_slot,
                    bytes,
                )?;
            }
            kernel.copies_reduce(
                from_host,
                launch.dst + offset,
                launch.src + offset,
                staging + in_slot,
                bytes / element,
                launch.divide_by,
                exchange,
            )?;
            self.record(&self.reduced[index], from_host)?;
        }
        // Results out, as each chunk is reduced.
        for index in 0..count {
            self.wait(to_host, &self.reduced[index])?;
            let (offset, in_slot, bytes) = geometry.chunk(rank, index);
            for peer in geometry.peers() {
                let slot = blocks.results(peer, rank, nranks, window) + in_slot;
                self.copy(to_host, slot, launch.dst + offset, bytes)?;
            }
            kernel.copies_flag(CopyFlag::Signal, to_host, exchange, 1, index as u32)?;
        }
        // The owners' results in.
        for index in 0..count {
            kernel.copies_flag(CopyFlag::Await, from_host, exchange, 1, index as u32)?;
            for owner in geometry.peers() {
                let (offset, in_slot, bytes) = geometry.chunk(owner, index);
                let slot = blocks.results(rank, owner, nranks, window) + in_slot;
                self.copy(from_host, launch.dst + offset, slot, bytes)?;
            }
        }
        kernel.copies_flag(CopyFlag::Meet, from_host, exchange, 1, 0)?;
        self.record(&self.to_host_done, to_host)?;
        self.record(&self.from_host_done, from_host)?;
        self.wait(stream, &self.to_host_done)?;
        self.wait(stream, &self.from_host_done)
    }

    /// Queues a copy of `bytes` on `stream` between two addresses of the
    /// unified address space (device memory, or the registered exchange
    /// blocks: the driver tells which from the addresses).
    fn copy(&self, stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
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
