//! all_reduce with the hand-off on the GPU: one kernel launch per call on
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
//! Every wait is bounded: a block that sees no flag within the timeout
//! writes what it waited for into a host-mapped error word and ends the
//! kernel; the communicator then refuses every later call with that error.
//! Every flag carries the call it was raised for, so ranks that call
//! differently are told so at once, with both calls.
//! The kernels spin on each other, so the grid is small enough to be
//! resident on every GPU, and ranks sharing one GPU do not use this path by
//! default (time-sliced contexts make every hand-off wait for a time slice).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::communicator::{on_rank, CudaCommunicator};
use super::gpu::{CudaError, DeviceBuffer, FailureReport, Gpu, HostRegistration, BACKEND};
use super::ipc::{self, PeerMemory, HANDLE_WORDS};
use super::kernels::{
    ExchangeArg, HandoffKernel, HandoffLaunch, HANDOFF_BLOCKS, HANDOFF_HEADER_BYTES,
};
use crate::engine::transport::PeerWatch;
use crate::engine::{
    Algorithm, AlgorithmChoice, CallDescriptor, CallKind, DType, Element, EngineError, ReduceOp,
};
use crate::trace::Arg;

/// Which hand-off a communicator uses (rank 0's choice holds for all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// On the GPU when every rank has a GPU of its own (at most 8 ranks)
    /// and the ring is not forced: through device memory over peer-to-peer,
    /// or through pinned shared host memory without it. On the host
    /// otherwise.
    Auto = 0,
    /// Always on the GPU (ranks sharing a GPU then wait for each other's
    /// time slices unless MPS runs them together: for tests).
    Gpu = 1,
    /// Ranks meet on the host after every step (the host-mediated path).
    Host = 2,
}

impl Handoff {
    /// The choice as rank 0 broadcast it (`as i64`).
    pub(super) fn from_word(word: i64) -> Option<Handoff> {
        [Handoff::Auto, Handoff::Gpu, Handoff::Host]
            .into_iter()
            .find(|handoff| *handoff as i64 == word)
    }
}

/// The error word's failures: `kind << 16 | detail << 8 | peer`. Kernels
/// write TIMED_OUT (detail: the phase waited in) and MISMATCHED (the peer's
/// flag came with another call: the calls are in the report); the watchdog
/// writes PEER_EXITED.
const TIMED_OUT: u32 = 1;
const PEER_EXITED: u32 = 2;
const MISMATCHED: u32 = 3;

/// What the report says, as the engine's error.
fn failure(report: &FailureReport, rank: usize, timeout: Duration, pids: &[u32]) -> EngineError {
    let word = report.read();
    let peer = (word & 0xff) as usize;
    match word >> 16 {
        MISMATCHED => {
            let [theirs_head, theirs_count, ours_head, ours_count] = report.calls();
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
    }
}

/// A thread asleep on the peers' pidfds: a peer whose process exits has its
/// rank written into the error word, which every waiting kernel block reads
/// now and then, so the kernels end at once instead of at their timeout and
/// the communicator reports `PeerDied`.
struct Watchdog {
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(watch: PeerWatch, error: Arc<FailureReport>) -> std::io::Result<Watchdog> {
        let stop = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?;
        let wake = stop.as_fd().try_clone_to_owned()?;
        let thread = std::thread::Builder::new()
            .name("pcieipc-watchdog".into())
            .spawn(move || {
                if let Some((peer, _pid)) = watch.wait_for_exit(wake.as_fd()) {
                    if error.read() == 0 {
                        error.raise(PEER_EXITED << 16 | peer as u32);
                    }
                }
            })?;
        Ok(Watchdog {
            stop: stop.into(),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // An eventfd counter of 1 makes it readable: the thread wakes and ends.
        let _ = nix::unistd::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One collective as the launches see it: `count` elements per rank's part,
/// in launches of `piece` elements; `stride` elements between ranks' parts
/// of the input (reduce-scatter) or output (all-gather).
struct Call {
    kind: CallKind,
    kernel: HandoffKernel,
    dtype: DType,
    op: ReduceOp,
    count: usize,
    piece: usize,
    input: u64,
    output: u64,
    stride: usize,
    root: usize,
}

/// Where the exchange blocks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExchangeMemory {
    /// Each rank's device memory, opened by the peers over CUDA IPC.
    Device,
    /// The ranks' backend areas of the control plane's shared segment,
    /// pinned and mapped into every rank's GPU.
    Host,
}

/// Every rank's exchange block as this rank's GPU addresses it.
enum Blocks {
    Device {
        own: DeviceBuffer<u8>,
        /// `None` at our own rank.
        peers: Vec<Option<PeerMemory>>,
    },
    Host {
        areas: Vec<HostRegistration>,
    },
}

impl Blocks {
    fn address(&self, rank: usize) -> u64 {
        match self {
            Blocks::Device { own, peers } => peers[rank]
                .as_ref()
                .map_or_else(|| own.address(), PeerMemory::address),
            Blocks::Host { areas } => areas[rank].device_address(),
        }
    }

    fn count(&self) -> usize {
        match self {
            Blocks::Device { peers, .. } => peers.len(),
            Blocks::Host { areas } => areas.len(),
        }
    }
}

/// The exchange blocks and the state of the calls so far.
pub(super) struct Exchange {
    gpu: Arc<Gpu>,
    blocks_memory: Blocks,
    /// Each kernel block's launch counter (`HANDOFF_BLOCKS` words).
    epochs: DeviceBuffer<i64>,
    /// Bytes of one inbox or result slot (rank 0's choice).
    pub(super) window: usize,
    /// The grid of every launch (rank 0's choice: the flags are per block).
    blocks: u32,
    timeout: Duration,
    error: Arc<FailureReport>,
    /// Every rank's pid, to name a peer that exited.
    pids: Vec<u32>,
    _watchdog: Watchdog,
    /// Orders this communicator's launches when callers change streams.
    ordering: CudaEvent,
    last_stream: Option<Arc<CudaStream>>,
}

impl Exchange {
    /// Bytes of a rank's exchange block.
    pub(super) fn bytes(nranks: usize, window: usize) -> usize {
        HANDOFF_HEADER_BYTES + 4 * nranks * window
    }

    /// The grid rank 0 proposes: at most one block per multiprocessor, so
    /// that every block of a launch is resident while it spins.
    pub(super) fn proposed_blocks(gpu: &Gpu) -> u32 {
        gpu.multiprocessors().min(HANDOFF_BLOCKS as u32)
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // Launches on any stream may still use the blocks and the error word
        // (a kernel waiting for a peer that left ends at its timeout).
        let _ = self.gpu.synchronize();
    }
}

impl CudaCommunicator {
    /// Sets up the exchange blocks in `memory` and the watchdog
    /// (collective: every rank calls it at init when calls hand over on the
    /// GPU, then agrees on the outcome, which is also the barrier that keeps
    /// peers from writing into a block before it is zeroed and mapped).
    pub(super) fn open_exchange(
        &mut self,
        memory: ExchangeMemory,
        window: usize,
        blocks: u32,
        timeout: Duration,
    ) -> Result<(), EngineError> {
        let err = on_rank(self.rank);
        let bytes = Exchange::bytes(self.nranks, window);
        let blocks_memory = match memory {
            ExchangeMemory::Device => self.open_device_blocks(bytes)?,
            ExchangeMemory::Host => self.open_host_blocks(bytes)?,
        };
        let epochs = DeviceBuffer::<i64>::zeroed(&self.gpu, HANDOFF_BLOCKS).map_err(&err)?;
        let error = Arc::new(FailureReport::new(&self.gpu).map_err(&err)?);
        let ordering = self.gpu.new_event().map_err(&err)?;
        let pids = self.control.pids();
        let watch = PeerWatch::open(self.rank, pids.clone()).map_err(EngineError::from)?;
        let watchdog = Watchdog::start(watch, error.clone())
            .map_err(|source| EngineError::transport(self.rank, BACKEND, source))?;
        self.exchange = Some(Exchange {
            gpu: self.gpu.clone(),
            blocks_memory,
            epochs,
            window,
            blocks,
            timeout,
            error,
            pids,
            _watchdog: watchdog,
            ordering,
            last_stream: None,
        });
        Ok(())
    }

    /// Allocates this rank's block in device memory, exports it, and opens
    /// every peer's.
    fn open_device_blocks(&mut self, bytes: usize) -> Result<Blocks, EngineError> {
        let err = on_rank(self.rank);
        let own = DeviceBuffer::<u8>::zeroed(&self.gpu, bytes).map_err(&err)?;
        let handle = ipc::export(&self.gpu, own.address()).map_err(&err)?;
        let mut handles = vec![0i64; HANDLE_WORDS * self.nranks];
        self.control.all_gather(&handle, &mut handles)?;
        let mut peers = Vec::with_capacity(self.nranks);
        for peer in 0..self.nranks {
            peers.push(if peer == self.rank {
                None
            } else {
                let words: &[i64; HANDLE_WORDS] = handles[peer * HANDLE_WORDS..][..HANDLE_WORDS]
                    .try_into()
                    .expect("HANDLE_WORDS words");
                Some(PeerMemory::open(&self.gpu, words).map_err(&err)?)
            });
        }
        Ok(Blocks::Device { own, peers })
    }

    /// Pins every rank's backend area of the control plane's segment (fresh
    /// memfd pages: zeroed) and maps it into this GPU.
    fn open_host_blocks(&mut self, bytes: usize) -> Result<Blocks, EngineError> {
        let err = on_rank(self.rank);
        let mut areas = Vec::with_capacity(self.nranks);
        for owner in 0..self.nranks {
            let (start, length) = self
                .control
                .backend_area(owner)
                .filter(|(_, length)| *length >= bytes)
                .ok_or_else(|| err(CudaError::NoHostExchange { bytes }))?;
            // SAFETY: the area is `length` bytes of the control plane's
            // mapping, which lives as long as the communicator; the exchange
            // (and this registration) is dropped before the control plane
            // (field order of `CudaCommunicator`).
            areas.push(unsafe { HostRegistration::new(&self.gpu, start, length) }.map_err(&err)?);
        }
        Ok(Blocks::Host { areas })
    }

    /// The bytes of each inbox and result slot of the GPU hand-off (rank
    /// 0's choice), `None` on the host hand-off.
    pub fn handoff_window(&self) -> Option<usize> {
        self.exchange.as_ref().map(|exchange| exchange.window)
    }

    /// Whether calls hand over on the GPU.
    pub fn hands_off_on_gpu(&self) -> bool {
        self.exchange.is_some()
    }

    /// The error a hand-off kernel reported, if one has: every later call
    /// is refused with it.
    pub fn gpu_failure(&self) -> Option<EngineError> {
        let exchange = self.exchange.as_ref()?;
        match exchange.error.read() {
            0 => None,
            _ => Some(failure(
                &exchange.error,
                self.rank,
                exchange.timeout,
                &exchange.pids,
            )),
        }
    }

    /// Queues `output[i]` = `op` over all ranks' `input[i]` on `stream` and
    /// returns at once (nothing waits on the host): the result is there when
    /// the stream reaches it. Every rank must make the same calls in the same
    /// order. Capturable in a CUDA graph. Needs the GPU hand-off
    /// ([`hands_off_on_gpu`](Self::hands_off_on_gpu)).
    pub fn all_reduce_on_stream<T: Element>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        EngineError::check_length("all_reduce output", output.len(), input.len())?;
        self.check_gpu(input.gpu())?;
        self.check_gpu(output.gpu())?;
        // SAFETY: both buffers hold `input.len()` elements of `T`; their
        // memory is freed only once every stream of the context has drained
        // (an allocation's drop synchronizes the context), so the queued
        // launches never touch freed memory.
        unsafe {
            self.all_reduce_raw(
                input.address(),
                output.address(),
                input.len(),
                T::DTYPE,
                op,
                stream,
            )
        }
    }

    /// In place: `buffer[i]` = `op` over all ranks' `buffer[i]`, queued on
    /// `stream`.
    pub fn all_reduce_in_place_on_stream<T: Element>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        self.check_gpu(buffer.gpu())?;
        let address = buffer.address();
        // SAFETY: as in `all_reduce_on_stream`, with one buffer.
        unsafe { self.all_reduce_raw(address, address, buffer.len(), T::DTYPE, op, stream) }
    }

    fn check_gpu(&self, gpu: &Arc<Gpu>) -> Result<(), EngineError> {
        if Arc::ptr_eq(gpu, &self.gpu) {
            Ok(())
        } else {
            Err(EngineError::WrongGpu {
                rank: self.rank,
                buffer_gpu: gpu.ordinal(),
                gpu: self.gpu.ordinal(),
            })
        }
    }

    /// The algorithm a GPU hand-off all_reduce of `bytes` takes: one-shot
    /// while the message fits the one-shot budget and one slot, else the
    /// direct (two-shot) all_reduce: rank r reduces segment r from every
    /// rank's push and pushes the result to every rank.
    pub(super) fn handoff_algorithm(&self, bytes: usize, window: usize) -> Algorithm {
        match self.algorithm {
            AlgorithmChoice::Fixed(algorithm) => algorithm,
            AlgorithmChoice::Auto if bytes <= self.layout.one_shot_bytes.min(window) => {
                Algorithm::OneShot
            }
            AlgorithmChoice::Auto => Algorithm::Direct,
        }
    }

    /// Queues the all_reduce of `count` elements of `dtype` at device
    /// address `input` into `output` (the same for in place) on `stream`:
    /// one launch per window-sized piece.
    ///
    /// # Safety
    ///
    /// `input` and `output` are device addresses of this communicator's GPU,
    /// each the start of `count` elements of `dtype`, alive until `stream`
    /// has run the call.
    pub unsafe fn all_reduce_raw(
        &mut self,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        let window = self.usable_window()?;
        let algorithm = self.handoff_algorithm(count * dtype.size_bytes(), window);
        // One-shot: the message fits a slot; two-shot: each rank's segment
        // (whole 16-byte vectors) does.
        let (kernel, piece) = match algorithm {
            Algorithm::OneShot => (HandoffKernel::OneShot, window / dtype.size_bytes()),
            Algorithm::Direct => (
                HandoffKernel::TwoShot,
                window / 16 * self.nranks * 16 / dtype.size_bytes(),
            ),
            Algorithm::Ring => unreachable!("init keeps the ring on the host hand-off"),
        };
        let call = Call {
            kind: CallKind::AllReduce,
            kernel,
            dtype,
            op,
            count,
            piece,
            input,
            output,
            stride: 0,
            root: 0,
        };
        // SAFETY: the caller's promise, as `queue` needs it.
        unsafe { self.queue(call, algorithm, stream) }
    }

    /// Queues rank r's `output` = `op` over all ranks' `input[r·m..(r+1)·m]`
    /// (m = `output.len()`, `input.len()` = N·m) on `stream`. As
    /// [`all_reduce_on_stream`](Self::all_reduce_on_stream): returns at once.
    pub fn reduce_scatter_on_stream<T: Element>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        EngineError::check_length(
            "reduce_scatter input",
            input.len(),
            self.nranks * output.len(),
        )?;
        self.check_gpu(input.gpu())?;
        self.check_gpu(output.gpu())?;
        // SAFETY: `input` holds N·m and `output` m elements of `T`; freed
        // memory waits for the context's streams (as in all_reduce_on_stream).
        unsafe {
            self.reduce_scatter_raw(
                input.address(),
                output.address(),
                output.len(),
                T::DTYPE,
                op,
                stream,
            )
        }
    }

    /// The reduce_scatter of N·`count` elements of `dtype` at `input` into
    /// `count` at `output`.
    ///
    /// # Safety
    ///
    /// As `all_reduce_raw`, with `input` holding N·`count` elements and not
    /// overlapping `output`.
    pub unsafe fn reduce_scatter_raw(
        &mut self,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        let window = self.usable_window()?;
        let call = Call {
            kind: CallKind::ReduceScatter,
            kernel: HandoffKernel::ReduceScatter,
            dtype,
            op,
            count,
            piece: window / dtype.size_bytes(),
            input,
            output,
            stride: count,
            root: 0,
        };
        // SAFETY: the caller's promise.
        unsafe { self.queue(call, Algorithm::Direct, stream) }
    }

    /// Queues `output[r·m..(r+1)·m]` = rank r's `input` (m = `input.len()`,
    /// `output.len()` = N·m) on `stream`; `input` may be this rank's part of
    /// `output` only through [`all_gather_raw`](Self::all_gather_raw).
    pub fn all_gather_on_stream<T: Element>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        EngineError::check_length("all_gather output", output.len(), self.nranks * input.len())?;
        self.check_gpu(input.gpu())?;
        self.check_gpu(output.gpu())?;
        // SAFETY: as in `reduce_scatter_on_stream`, the other way round.
        unsafe {
            self.all_gather_raw(
                input.address(),
                output.address(),
                input.len(),
                T::DTYPE,
                stream,
            )
        }
    }

    /// The all_gather of `count` elements of `dtype` per rank from `input`
    /// into `output` (N·`count` elements; `input` may be this rank's part of
    /// it, for in place).
    ///
    /// # Safety
    ///
    /// As `all_reduce_raw`, with `output` holding N·`count` elements.
    pub unsafe fn all_gather_raw(
        &mut self,
        input: u64,
        output: u64,
        count: usize,
        dtype: DType,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        let window = self.usable_window()?;
        let call = Call {
            kind: CallKind::AllGather,
            kernel: HandoffKernel::AllGather,
            dtype,
            op: ReduceOp::Sum,
            count,
            piece: window / dtype.size_bytes(),
            input,
            output,
            stride: count,
            root: 0,
        };
        // SAFETY: the caller's promise.
        unsafe { self.queue(call, Algorithm::Direct, stream) }
    }

    /// Queues every rank's `buffer` = rank `root`'s on `stream`.
    pub fn broadcast_on_stream<T: Element>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        self.check_gpu(buffer.gpu())?;
        // SAFETY: `buffer` holds `count` elements; freed memory waits for
        // the context's streams.
        unsafe { self.broadcast_raw(buffer.address(), buffer.len(), T::DTYPE, root, stream) }
    }

    /// The broadcast of `count` elements of `dtype` at `buffer` from `root`.
    ///
    /// # Safety
    ///
    /// As `all_reduce_raw`, with one buffer.
    pub unsafe fn broadcast_raw(
        &mut self,
        buffer: u64,
        count: usize,
        dtype: DType,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        if root >= self.nranks {
            return Err(EngineError::RootOutOfRange {
                root,
                nranks: self.nranks,
            });
        }
        let window = self.usable_window()?;
        let call = Call {
            kind: CallKind::Broadcast,
            kernel: HandoffKernel::Broadcast,
            dtype,
            op: ReduceOp::Sum,
            count,
            piece: window / dtype.size_bytes(),
            input: buffer,
            output: buffer,
            stride: 0,
            root,
        };
        // SAFETY: the caller's promise.
        unsafe { self.queue(call, Algorithm::OneShot, stream) }
    }

    /// The slot size of the GPU hand-off, after checking that calls may be
    /// made: the hand-off is open, no kernel has reported a failure, and no
    /// fault on the followed device failed the job.
    fn usable_window(&mut self) -> Result<usize, EngineError> {
        if let Some(failure) = self.gpu_failure() {
            return Err(failure);
        }
        // The device under this rank (`CommOptions::link_device`), where the
        // control plane follows one: its faults are acted on per call, as on
        // the host transports (a fatal one fails the call).
        self.control.follow_faults()?;
        self.exchange
            .as_ref()
            .map(|exchange| exchange.window)
            .ok_or_else(|| EngineError::transport(self.rank, BACKEND, CudaError::NoGpuHandoff))
    }

    /// Queues `call`, one launch per `piece` elements.
    ///
    /// # Safety
    ///
    /// `call.input` and `call.output` are device addresses of this
    /// communicator's GPU holding what `call.kernel` reads and writes for
    /// `call.count` elements (and `call.stride`), alive until `stream` has
    /// run the call.
    unsafe fn queue(
        &mut self,
        call: Call,
        algorithm: Algorithm,
        stream: &Arc<CudaStream>,
    ) -> Result<(), EngineError> {
        let err = on_rank(self.rank);
        let descriptor = CallDescriptor {
            kind: call.kind,
            dtype: call.dtype,
            op: (call.kind == CallKind::AllReduce || call.kind == CallKind::ReduceScatter)
                .then_some(call.op),
            count: call.count as u64,
            root: call.root as u32,
            algorithm,
            chunk_bytes: 0,
            bypass_slots: false,
        };
        self.last_call = Some(descriptor);
        let [call_head, call_count, _] = descriptor.to_words();
        if call.count == 0 {
            return Ok(());
        }
        let kernel = self.gpu.kernel(call.dtype, call.op).map_err(&err)?;
        let divide_by = if call.op == ReduceOp::Avg {
            self.nranks as u32
        } else {
            0
        };
        self.order_after_last_call(stream).map_err(&err)?;
        let (rank, nranks, element) = (self.rank, self.nranks, call.dtype.size_bytes());
        let exchange = self.exchange.as_mut().expect("usable_window checked it");
        let argument = ExchangeArg {
            base: std::array::from_fn(|rank| {
                if rank < exchange.blocks_memory.count() {
                    exchange.blocks_memory.address(rank)
                } else {
                    0
                }
            }),
            window: exchange.window as u64,
            rank: rank as u32,
            nranks: nranks as u32,
            timeout_ns: exchange.timeout.as_nanos() as u64,
            error: exchange.error.device_address(),
            epochs: exchange.epochs.address(),
            call: [call_head, call_count],
            calls: exchange.error.calls_device_address(),
        };
        let blocks = exchange.blocks;
        let traced = match &mut self.kernel_spans {
            Some(spans) => Some(spans.begin(stream).map_err(&err)?),
            None => None,
        };
        let mut done = 0;
        while done < call.count {
            let elements = call.piece.min(call.count - done);
            let offset = (done * element) as u64;
            let launch = HandoffLaunch {
                kernel: call.kernel,
                dst: call.output + offset,
                src: call.input + offset,
                elements,
                stride: call.stride,
                divide_by,
                root: call.root as u32,
            };
            kernel
                .handoff(&self.gpu, &launch, stream, blocks, &argument)
                .map_err(&err)?;
            done += elements;
        }
        if let (Some(spans), Some(start)) = (&mut self.kernel_spans, traced) {
            spans
                .end(
                    start,
                    stream,
                    call.kind.name(),
                    vec![
                        ("dtype", Arg::Text(call.dtype.name())),
                        ("count", Arg::Int(call.count as i64)),
                        ("algorithm", Arg::Text(algorithm.name())),
                        ("blocks", Arg::Int(i64::from(blocks))),
                    ],
                )
                .map_err(&err)?;
        }
        Ok(())
    }

    /// A call on another stream than the last one waits for the last one's
    /// launches: the parity argument needs one rank's launches in order.
    fn order_after_last_call(&mut self, stream: &Arc<CudaStream>) -> Result<(), CudaError> {
        let gpu = self.gpu.clone();
        let exchange = self.exchange.as_mut().expect("the GPU hand-off is open");
        if let Some(last) = &exchange.last_stream {
            if !Arc::ptr_eq(last, stream) {
                exchange
                    .ordering
                    .record(last)
                    .map_err(gpu.driver("recording the last call's event"))?;
                stream
                    .wait(&exchange.ordering)
                    .map_err(gpu.driver("ordering after the last call"))?;
            }
        }
        exchange.last_stream = Some(stream.clone());
        Ok(())
    }
}
