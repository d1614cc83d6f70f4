//! The CUDA communicator: all_reduce of device buffers across ranks in
//! separate processes, each on a GPU of its choice (several may share one).
//!
//! Data moves GPU to GPU: every rank exports a staging block by legacy IPC,
//! opens its peers' blocks once at init, and each ring step is one reduce
//! kernel that reads the predecessor's chunk straight from the peer mapping
//! and writes the rank's own slot (no spinning kernels, no peer atomics).
//! The steps come from `schedule`, as the host collectives' do.
//!
//! Ranks synchronise on the host: after queueing a step the rank sleeps on a
//! blocking-sync event until its GPU has run it, then meets its peers in an
//! 8-byte all_reduce on the host control plane (a host `Communicator`: futex
//! sleeps, liveness, timeouts, errors that name the rank). Flags polled by
//! kernels would occupy the GPU while they wait, and ranks sharing one GPU
//! are time-sliced, so a polling kernel could hold the GPU its peer needs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::gpu::{CudaError, DeviceBuffer, Gpu, BACKEND};
use super::handoff::{Exchange, ExchangeMemory, Handoff};
use super::ipc::{self, PeerMemory, HANDLE_WORDS};
use super::kernels::{HANDOFF_BLOCKS, HANDOFF_MAX_RANKS, ONE_SHOT_MAX_RANKS};
use super::registration::Registration;
use super::tracing::KernelSpans;
use crate::engine::schedule::{self, Limits};
use crate::engine::{
    Algorithm, AlgorithmChoice, CallDescriptor, CommOptions, Communicator, Element, EngineError,
    ReduceOp,
};

/// How ranks move data between GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Kernels read peers' memory over peer-to-peer (or within one GPU).
    PeerToPeer,
    /// Kernels write and read pinned shared host memory over PCIe, handing
    /// over on the GPU: taken without peer-to-peer (`reason`) when every
    /// rank has a GPU of its own (or the GPU hand-off is forced).
    HostMapped { reason: String },
    /// Device → host, the shm transport's all_reduce, host → device, ranks
    /// meeting on the host: taken without peer-to-peer (`reason`) when the
    /// hand-off is on the host (ranks sharing a GPU, or asked for).
    HostStaged { reason: String },
}

/// Whether to try peer-to-peer at init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerToPeer {
    /// Use it when every pair passes the write-and-verify check.
    Auto,
    /// Always stage through host memory.
    Off,
}

/// How a reduce step gets the predecessor's chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRead {
    /// The reduce kernel loads it straight from the peer's memory.
    Direct,
    /// The copy engine brings it into a local buffer first, then the
    /// kernel reduces locally.
    CopyEngine,
}

#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// The host control plane's options (its transport, rendezvous and peer
    /// timeouts, spin before sleeping, CPU binding).
    pub control: CommOptions,
    /// Bytes per ring chunk, one staging slot each. Rank 0's value is used.
    pub chunk_bytes: usize,
    /// all_reduce goes one-shot while bytes·(N−1) fits this budget (and N is
    /// at most 8); it is also the size of each one-shot buffer. Rank 0's
    /// value is used.
    pub one_shot_read_budget: usize,
    pub algorithm: AlgorithmChoice,
    pub peer_to_peer: PeerToPeer,
    pub peer_read: PeerRead,
    /// How long a rank polls its GPU's completion event before it sleeps on
    /// it (the waits for peers are the control plane's, with its own spin).
    pub gpu_poll: Duration,
    /// Where ranks hand over: on the GPU (stream-ordered calls) or on the
    /// host after every step.
    pub handoff: Handoff,
    /// GPU hand-off: bytes of each inbox and result slot of the exchange
    /// blocks (a one-shot launch carries up to one, a two-shot launch one
    /// per rank). `None`: 32 MiB / N, so that a two-shot launch carries 32
    /// MiB and an exchange block takes 128 MiB whatever N (4 MiB windows
    /// were 17% behind the host hand-off at 128 MiB on one H200; 16 MiB
    /// level with it, 64 MiB ahead at four times the memory). Rank 0's
    /// value is used.
    pub handoff_window: Option<usize>,
    /// GPU hand-off: how long a kernel waits for a peer's flag before it
    /// fails the call (and the communicator) naming that peer.
    pub handoff_timeout: Duration,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            control: CommOptions::default(),
            chunk_bytes: 16 << 20,
            one_shot_read_budget: 256 << 10,
            algorithm: AlgorithmChoice::Auto,
            peer_to_peer: PeerToPeer::Auto,
            peer_read: PeerRead::Direct,
            gpu_poll: Duration::from_micros(200),
            handoff: Handoff::Auto,
            handoff_window: None,
            handoff_timeout: Duration::from_secs(10),
        }
    }
}

/// Where things sit in a rank's staging block: for each ring step k two slots
/// (the message of step k for chunk c lives in slot (k, (c + k) mod 2), so a
/// slot is rewritten only two barriers after its reader has used it), then
/// the two one-shot buffers, alternated between rounds.
#[derive(Clone, Copy, Debug)]
pub(super) struct StagingLayout {
    pub(super) slot_bytes: usize,
    pub(super) steps: usize,
    pub(super) one_shot_bytes: usize,
}

impl StagingLayout {
    pub(super) fn slot(&self, step: usize, parity: usize) -> usize {
        (step * 2 + parity) * self.slot_bytes
    }

    pub(super) fn one_shot(&self, parity: usize) -> usize {
        self.steps * 2 * self.slot_bytes + parity * self.one_shot_bytes
    }

    fn total(&self) -> usize {
        self.one_shot(2)
    }
}

/// What a two-shot launch of the GPU hand-off carries by default.
const HANDOFF_LAUNCH_BYTES: usize = 32 << 20;

/// The largest hand-off window a rank accepts from rank 0.
const MAX_HANDOFF_WINDOW: usize = 1 << 30;

/// Bytes at the start of each staging block written with a rank-specific
/// pattern at init and read back by every peer (the peer-to-peer check).
const CHECK_BYTES: usize = 4096;

fn check_pattern(rank: usize) -> Vec<u8> {
    (0..CHECK_BYTES)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(rank as u8 * 101 + 7)
        })
        .collect()
}

/// This backend's errors as the engine reports them, on `rank`.
pub(super) fn on_rank(rank: usize) -> impl Fn(CudaError) -> EngineError {
    move |error| EngineError::transport(rank, BACKEND, error)
}

pub struct CudaCommunicator {
    /// The GPU hand-off's exchange blocks, when calls hand over on the GPU.
    /// Declared (so dropped) before `control`: through host memory, the
    /// blocks are registrations of the control plane's segment.
    pub(super) exchange: Option<Exchange>,
    pub(super) control: Communicator,
    pub(super) gpu: Arc<Gpu>,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) algorithm: AlgorithmChoice,
    pub(super) gpu_poll: Duration,
    pub(super) path: DataPath,
    pub(super) layout: StagingLayout,
    pub(super) staging: DeviceBuffer<u8>,
    /// One chunk of local memory the copy engine fills on `PeerRead::CopyEngine`.
    pub(super) landing: Option<DeviceBuffer<u8>>,
    /// Each peer's staging block as mapped here (`None` at our own rank, and
    /// everywhere on the host-staged path).
    pub(super) peer_staging: Vec<Option<PeerMemory>>,
    /// Registered buffers by their address on this rank.
    pub(super) registered: HashMap<u64, Registration>,
    pub(super) one_shot_parity: usize,
    pub(super) last_call: Option<CallDescriptor>,
    pub(super) init_time: Duration,
    /// The kernels of each call on the GPU hand-off, when tracing.
    pub(super) kernel_spans: Option<KernelSpans>,
}

impl CudaCommunicator {
    /// Joins `rendezvous` as `rank` of `nranks` on `gpu`: the host control
    /// plane, the staging blocks and their IPC handles, the peer-to-peer
    /// check. Collective: every rank calls it.
    pub fn init(
        rendezvous: &str,
        rank: usize,
        nranks: usize,
        gpu: Arc<Gpu>,
        options: CudaOptions,
    ) -> Result<CudaCommunicator, EngineError> {
        let started = Instant::now();
        let window = options
            .handoff_window
            .unwrap_or(HANDOFF_LAUNCH_BYTES / nranks.max(1))
            .max(16)
            .next_multiple_of(16);
        // The GPU hand-off through host memory keeps its exchange blocks in
        // the control plane's segment, which is made at the rendezvous: ask
        // for the room whenever that path may be taken (memfd pages cost
        // nothing until touched). Rank 0's request is the one granted.
        let may_hand_off_through_host = options.handoff != Handoff::Host
            && nranks <= HANDOFF_MAX_RANKS
            && !options.control.transport.capabilities().device_memory;
        let control_options = CommOptions {
            backend_bytes: if may_hand_off_through_host {
                Exchange::bytes(nranks, window)
            } else {
                0
            },
            ..options.control.clone()
        };
        let mut control = Communicator::init(rendezvous, rank, nranks, control_options)?;
        let err = on_rank(rank);
        // Rank 0's geometry and hand-off: every rank computes offsets in its
        // peers' blocks, and all must take the same path.
        let mut geometry = [
            options.chunk_bytes as i64,
            options.one_shot_read_budget as i64,
            window as i64,
            options.handoff as i64,
        ];
        control.broadcast(&mut geometry, 0)?;
        let handoff =
            Handoff::from_word(geometry[3]).ok_or_else(|| EngineError::RendezvousProtocol {
                name: rendezvous.to_owned(),
                rank: 0,
                reason: format!("hand-off {} (0 to 2)", geometry[3]),
            })?;
        let window = usize::try_from(geometry[2])
            .ok()
            .filter(|window| {
                (16..=MAX_HANDOFF_WINDOW).contains(window) && window.is_multiple_of(16)
            })
            .ok_or_else(|| EngineError::RendezvousProtocol {
                name: rendezvous.to_owned(),
                rank: 0,
                reason: format!(
                    "hand-off window of {} bytes (a multiple of 16 up to {MAX_HANDOFF_WINDOW})",
                    geometry[2]
                ),
            })?;
        let layout = StagingLayout {
            // 16-byte multiples keep chunk boundaries on the kernels' vector width.
            slot_bytes: (geometry[0] as usize).max(16).next_multiple_of(16),
            steps: 2 * nranks.saturating_sub(1),
            one_shot_bytes: (geometry[1] as usize).max(16).next_multiple_of(16),
        };
        let mut staging =
            DeviceBuffer::<u8>::zeroed(&gpu, layout.total().max(CHECK_BYTES)).map_err(&err)?;
        let mut check = vec![0u8; staging.len()];
        check[..CHECK_BYTES].copy_from_slice(&check_pattern(rank));
        staging.copy_from_host(&check).map_err(&err)?;
        let handle = ipc::export(&gpu, staging.address()).map_err(&err)?;
        let mut handles = vec![0i64; HANDLE_WORDS * nranks];
        control.all_gather(&handle, &mut handles)?;

        let mut communicator = CudaCommunicator {
            control,
            rank,
            nranks,
            algorithm: options.algorithm,
            gpu_poll: options.gpu_poll,
            path: DataPath::PeerToPeer,
            layout,
            staging,
            landing: match options.peer_read {
                PeerRead::Direct => None,
                PeerRead::CopyEngine => {
                    Some(DeviceBuffer::<u8>::zeroed(&gpu, layout.slot_bytes).map_err(&err)?)
                }
            },
            peer_staging: (0..nranks).map(|_| None).collect(),
            registered: HashMap::new(),
            one_shot_parity: 0,
            last_call: None,
            exchange: None,
            init_time: Duration::ZERO,
            kernel_spans: None,
            gpu,
        };
        if communicator.control.trace().is_some() {
            communicator.kernel_spans = Some(KernelSpans::new(communicator.gpu.clone()));
        }
        let reason = match options.peer_to_peer {
            PeerToPeer::Off => Some("peer-to-peer turned off".to_owned()),
            PeerToPeer::Auto => communicator.open_peers(&handles).err(),
        };
        // Every rank must take the same path: any failed check sends all to
        // the host. The highest failing rank's reason is the one reported.
        let mut failed = [reason.as_ref().map_or(0, |_| rank as i64 + 1)];
        communicator
            .control
            .all_reduce_in_place(&mut failed, ReduceOp::Max)?;
        if failed[0] != 0 {
            communicator
                .peer_staging
                .iter_mut()
                .for_each(|peer| *peer = None);
            communicator.path = DataPath::HostStaged {
                reason: reason.unwrap_or_else(|| {
                    format!("rank {}'s peer-to-peer check failed", failed[0] - 1)
                }),
            };
        }
        // The GPU hand-off needs a slot per rank in the kernels' argument
        // and (unless forced) a GPU per rank: ranks sharing one are
        // time-sliced, and each hand-off would wait for a slice. Every rank
        // learns the same facts, so all choose alike. The grid is the
        // smallest any rank proposes: every rank's must be resident at once.
        let mut facts = vec![0i64; 2 * nranks];
        let address = communicator.gpu.pci_address().map_err(&err)?;
        let proposed = i64::from(Exchange::proposed_blocks(&communicator.gpu));
        communicator
            .control
            .all_gather(&[address, proposed], &mut facts)?;
        let distinct = {
            let mut addresses: Vec<i64> = facts.iter().step_by(2).copied().collect();
            addresses.sort_unstable();
            addresses.windows(2).all(|pair| pair[0] != pair[1])
        };
        let blocks = facts
            .iter()
            .skip(1)
            .step_by(2)
            .map(|&blocks| blocks.clamp(1, HANDOFF_BLOCKS as i64) as u32)
            .min()
            .unwrap_or(1);
        let ring = options.algorithm == AlgorithmChoice::Fixed(Algorithm::Ring);
        let gpu_handoff = nranks <= HANDOFF_MAX_RANKS
            && match handoff {
                Handoff::Auto => distinct && !ring,
                Handoff::Gpu => true,
                Handoff::Host => false,
            };
        if gpu_handoff && ring {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm: Algorithm::Ring,
                reason: "the GPU hand-off runs one-shot and direct (two-shot) kernels",
            });
        }
        let mut opened = false;
        if gpu_handoff {
            match communicator.path.clone() {
                DataPath::PeerToPeer => {
                    let outcome = communicator.open_exchange(
                        ExchangeMemory::Device,
                        window,
                        blocks,
                        options.handoff_timeout,
                    );
                    communicator.agree(outcome)??;
                    opened = true;
                }
                DataPath::HostStaged { reason } | DataPath::HostMapped { reason } => {
                    let outcome = communicator.open_exchange(
                        ExchangeMemory::Host,
                        window,
                        blocks,
                        options.handoff_timeout,
                    );
                    match communicator.agree(outcome)? {
                        Ok(()) => {
                            communicator.path = DataPath::HostMapped { reason };
                            opened = true;
                        }
                        Err(failure) if handoff == Handoff::Gpu => return Err(failure),
                        // Automatic: the host-staged path still works.
                        Err(_) => communicator.exchange = None,
                    }
                }
            }
        }
        if !opened && options.algorithm == AlgorithmChoice::Fixed(Algorithm::Direct) {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm: Algorithm::Direct,
                reason: "the direct all_reduce of device buffers needs the GPU hand-off",
            });
        }
        communicator.init_time = started.elapsed();
        Ok(communicator)
    }

    /// Every rank's view of a step that may fail on some ranks only: `Ok`
    /// where it succeeded everywhere, else the failure (this rank's own, or
    /// the one naming the highest failing rank), the same on every rank.
    fn agree(
        &mut self,
        outcome: Result<(), EngineError>,
    ) -> Result<Result<(), EngineError>, EngineError> {
        let mut failed = [outcome.as_ref().map_or(self.rank as i64 + 1, |_| 0)];
        self.control
            .all_reduce_in_place(&mut failed, ReduceOp::Max)?;
        Ok(match (outcome, failed[0]) {
            (outcome, 0) => outcome,
            (Err(own), _) => Err(own),
            (Ok(()), failing) => Err(EngineError::PeerGpuFailed {
                rank: failing as usize - 1,
            }),
        })
    }

    /// Opens every peer's staging block and reads its check pattern back.
    /// Returns why peer-to-peer cannot be used, if it cannot.
    fn open_peers(&mut self, handles: &[i64]) -> Result<(), String> {
        let scratch = DeviceBuffer::<u8>::zeroed(&self.gpu, CHECK_BYTES * self.nranks)
            .map_err(|error| error.to_string())?;
        for peer in (0..self.nranks).filter(|peer| *peer != self.rank) {
            let words: &[i64; HANDLE_WORDS] = handles[peer * HANDLE_WORDS..][..HANDLE_WORDS]
                .try_into()
                .expect("HANDLE_WORDS words");
            let memory = PeerMemory::open(&self.gpu, words)
                .map_err(|error| format!("opening rank {peer}'s memory: {error}"))?;
            self.gpu
                .copy(
                    scratch.address() + (peer * CHECK_BYTES) as u64,
                    memory.address(),
                    CHECK_BYTES,
                )
                .map_err(|error| format!("reading rank {peer}'s memory: {error}"))?;
            self.peer_staging[peer] = Some(memory);
        }
        let seen = scratch.to_host().map_err(|error| error.to_string())?;
        for peer in (0..self.nranks).filter(|peer| *peer != self.rank) {
            if seen[peer * CHECK_BYTES..][..CHECK_BYTES] != check_pattern(peer)[..] {
                return Err(format!(
                    "rank {peer}'s check pattern read over peer-to-peer came back wrong"
                ));
            }
        }
        Ok(())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// `error`, a CUDA failure of this rank's (borrowing a caller's stream,
    /// say), as the engine reports it.
    pub fn cuda_error(&self, error: CudaError) -> EngineError {
        on_rank(self.rank)(error)
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn data_path(&self) -> &DataPath {
        &self.path
    }

    pub fn peer_read(&self) -> PeerRead {
        match self.landing {
            Some(_) => PeerRead::CopyEngine,
            None => PeerRead::Direct,
        }
    }

    /// The last call's descriptor (chunk_bytes 0 on the one-shot path,
    /// as on the host communicator).
    pub fn last_call(&self) -> Option<CallDescriptor> {
        self.last_call
    }

    pub fn chunk_bytes(&self) -> usize {
        self.layout.slot_bytes
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

    /// The algorithm an all_reduce of `count` elements of `T` takes.
    pub fn algorithm_for<T: Element>(&self, count: usize) -> Algorithm {
        let bytes = count * std::mem::size_of::<T>();
        if let Some(exchange) = &self.exchange {
            return self.handoff_algorithm(bytes, exchange.window);
        }
        let limits = Limits {
            one_shot_read_budget: self.layout.one_shot_bytes,
            one_shot_max_ranks: ONE_SHOT_MAX_RANKS,
            direct_messages: None,
        };
        schedule::select(
            self.algorithm,
            count * std::mem::size_of::<T>(),
            self.nranks,
            &limits,
        )
    }

    pub(super) fn own(&self, offset: usize) -> u64 {
        self.staging.address() + offset as u64
    }

    pub(super) fn peer(&self, peer: usize, offset: usize) -> u64 {
        self.peer_staging[peer]
            .as_ref()
            .expect("peer-to-peer path: every peer's staging block is open")
            .address()
            + offset as u64
    }
}

impl Drop for CudaCommunicator {
    fn drop(&mut self) {
        // The control plane writes the trace when it goes, after this.
        if let (Some(spans), Some(trace)) = (&mut self.kernel_spans, self.control.trace()) {
            spans.resolve(trace);
        }
    }
}
