//! The CUDA communicator: all_reduce of device buffers across ranks in
//! separate processes, each on a GPU of its choice (several may share one).
//!
//! Data moves GPU to GPU: every rank exports a staging block by legacy IPC,
//! opens its peers' blocks once at init, and each ring step is one reduce
//! kernel that reads the predecessor's chunk straight from the peer mapping
//! and writes the rank's own slot (no spinning kernels, no peer atomics).
//!
//! Ranks synchronise on the host: after queueing a step the rank sleeps on a
//! blocking-sync event until its GPU has run it, then meets its peers in an
//! 8-byte all_reduce on the host control plane (the shm communicator: futex
//! sleeps, liveness, timeouts, errors that name the rank). Flags polled by
//! kernels would occupy the GPU while they wait, and ranks sharing one GPU
//! are time-sliced, so a polling kernel could hold the GPU its peer needs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::gpu::{CudaError, DeviceBuffer, Gpu};
use super::ipc::{self, PeerMemory, HANDLE_WORDS};
use super::kernels::{Kernel, ONE_SHOT_MAX_RANKS};
use crate::engine::communicator::{clip, part};
use crate::engine::{
    Algorithm, AlgorithmChoice, CallDescriptor, CallKind, CommOptions, Communicator, DType,
    Element, EngineError, ReduceOp,
};

/// How ranks move data between GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Kernels read peers' memory over peer-to-peer (or within one GPU).
    PeerToPeer,
    /// Device → host, the shm transport's all_reduce, host → device: taken
    /// when peer-to-peer fails its check at init (the reason is kept), or
    /// when asked for.
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
    /// The host control plane's options (rendezvous and peer timeouts, spin
    /// before sleeping, CPU binding). Its transport is always shm.
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
        }
    }
}

/// Where things sit in a rank's staging block: for each ring step k two slots
/// (the message of step k for chunk c lives in slot (k, (c + k) mod 2), so a
/// slot is rewritten only two barriers after its reader has used it), then
/// the two one-shot buffers, alternated between rounds.
#[derive(Clone, Copy, Debug)]
struct StagingLayout {
    slot_bytes: usize,
    steps: usize,
    one_shot_bytes: usize,
}

impl StagingLayout {
    fn slot(&self, step: usize, parity: usize) -> usize {
        (step * 2 + parity) * self.slot_bytes
    }

    fn one_shot(&self, parity: usize) -> usize {
        self.steps * 2 * self.slot_bytes + parity * self.one_shot_bytes
    }

    fn total(&self) -> usize {
        self.one_shot(2)
    }
}

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

/// A buffer registered on every rank: peers' mappings of their counterparts.
struct Registration {
    bytes: usize,
    peers: Vec<Option<PeerMemory>>,
}

pub struct CudaCommunicator {
    control: Communicator,
    gpu: Arc<Gpu>,
    rank: usize,
    nranks: usize,
    algorithm: AlgorithmChoice,
    gpu_poll: Duration,
    path: DataPath,
    layout: StagingLayout,
    staging: DeviceBuffer<u8>,
    /// One chunk of local memory the copy engine fills on `PeerRead::CopyEngine`.
    landing: Option<DeviceBuffer<u8>>,
    /// Each peer's staging block as mapped here (`None` at our own rank, and
    /// everywhere on the host-staged path).
    peer_staging: Vec<Option<PeerMemory>>,
    /// Registered buffers by their address on this rank.
    registered: HashMap<u64, Registration>,
    one_shot_parity: usize,
    last_call: Option<CallDescriptor>,
    init_time: Duration,
}

fn cuda(rank: usize) -> impl Fn(CudaError) -> EngineError {
    move |error| EngineError::Cuda { rank, error }
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
        if options.algorithm == AlgorithmChoice::Fixed(Algorithm::Direct) {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm: Algorithm::Direct,
                reason: "device buffers move by CUDA IPC, not between host processes",
            });
        }
        let started = Instant::now();
        let mut control = Communicator::init(rendezvous, rank, nranks, options.control.clone())?;
        let err = cuda(rank);
        // Rank 0's geometry: every rank computes offsets in its peers' blocks.
        let mut geometry = [
            options.chunk_bytes as i64,
            options.one_shot_read_budget as i64,
        ];
        control.broadcast(&mut geometry, 0)?;
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
            init_time: Duration::ZERO,
            gpu,
        };
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
        communicator.init_time = started.elapsed();
        Ok(communicator)
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
        if self.nranks > ONE_SHOT_MAX_RANKS {
            return Algorithm::Ring;
        }
        self.algorithm.pick(
            count * std::mem::size_of::<T>(),
            self.nranks,
            self.layout.one_shot_bytes,
        )
    }

    /// Registers `buffer` for direct peer reads: later all_reduce calls whose
    /// input it is skip the copy into staging. Collective: every rank
    /// registers its counterpart buffer, in the same order. A buffer must be
    /// deregistered (collectively) before it is dropped.
    pub fn register<T: Element>(&mut self, buffer: &DeviceBuffer<T>) -> Result<(), EngineError> {
        let err = cuda(self.rank);
        let bytes = buffer.len() * std::mem::size_of::<T>();
        let mut mine = [0i64; HANDLE_WORDS + 1];
        mine[0] = bytes as i64;
        if self.path == DataPath::PeerToPeer {
            mine[1..].copy_from_slice(&ipc::export(&self.gpu, buffer.address()).map_err(&err)?);
        }
        let mut all = vec![0i64; (HANDLE_WORDS + 1) * self.nranks];
        self.control.all_gather(&mine, &mut all)?;
        let mut peers = Vec::with_capacity(self.nranks);
        for (peer, words) in all.chunks_exact(HANDLE_WORDS + 1).enumerate() {
            if words[0] != bytes as i64 {
                return Err(EngineError::MismatchedRegistration {
                    rank: self.rank,
                    peer,
                    detail: format!("{bytes} bytes here, {} bytes there", words[0]),
                });
            }
            let open = peer != self.rank && self.path == DataPath::PeerToPeer;
            peers.push(if open {
                let handle = words[1..].try_into().expect("HANDLE_WORDS words");
                Some(PeerMemory::open(&self.gpu, handle).map_err(&err)?)
            } else {
                None
            });
        }
        self.registered
            .insert(buffer.address(), Registration { bytes, peers });
        Ok(())
    }

    /// Closes the peers' mappings of `buffer`. Collective, like `register`.
    pub fn deregister<T: Element>(&mut self, buffer: &DeviceBuffer<T>) -> Result<(), EngineError> {
        // Nobody may still read it: every rank reaches this point first.
        let mut barrier = [0u8];
        self.control
            .all_reduce_in_place(&mut barrier, ReduceOp::Max)?;
        self.registered.remove(&buffer.address());
        Ok(())
    }

    /// `output[i]` = `op` over all ranks' `input[i]`.
    pub fn all_reduce<T: Element + Default>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        EngineError::check_length("all_reduce output", output.len(), input.len())?;
        self.all_reduce_at::<T>(input, output.address(), op)
            .and_then(|staged| match staged {
                Some(host) => output.copy_from_host(&host).map_err(cuda(self.rank)),
                None => Ok(()),
            })
    }

    /// `buffer[i]` = `op` over all ranks' `buffer[i]`.
    pub fn all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        let address = buffer.address();
        self.all_reduce_at::<T>(buffer, address, op)
            .and_then(|staged| match staged {
                Some(host) => buffer.copy_from_host(&host).map_err(cuda(self.rank)),
                None => Ok(()),
            })
    }

    /// The all_reduce of `source` into the buffer at `output` (the same
    /// address for in place). On the host-staged path the result comes back
    /// in host memory for the caller to upload.
    fn all_reduce_at<T: Element + Default>(
        &mut self,
        source: &DeviceBuffer<T>,
        output: u64,
        op: ReduceOp,
    ) -> Result<Option<Vec<T>>, EngineError> {
        let err = cuda(self.rank);
        if !Arc::ptr_eq(source.gpu(), &self.gpu) {
            return Err(EngineError::WrongGpu {
                rank: self.rank,
                buffer_gpu: source.gpu().ordinal(),
                gpu: self.gpu.ordinal(),
            });
        }
        let (input, count) = (source.address(), source.len());
        let algorithm = self.algorithm_for::<T>(count);
        let bytes = count * std::mem::size_of::<T>();
        let registered = self
            .registered
            .get(&input)
            .is_some_and(|registration| registration.bytes >= bytes);
        let call = CallDescriptor {
            kind: CallKind::AllReduce,
            dtype: T::DTYPE,
            op: Some(op),
            count: count as u64,
            root: 0,
            algorithm,
            chunk_bytes: self.layout.slot_bytes as u32,
        };
        self.check_call(call, registered)?;
        self.last_call = Some(CallDescriptor {
            chunk_bytes: match algorithm {
                Algorithm::Ring => call.chunk_bytes,
                Algorithm::OneShot | Algorithm::Direct => 0,
            },
            ..call
        });
        if let DataPath::HostStaged { .. } = self.path {
            let mut host = vec![T::default(); count];
            source.copy_to_host(&mut host).map_err(&err)?;
            self.control.all_reduce_in_place(&mut host, op)?;
            self.last_call = self.control.last_call();
            return Ok(Some(host));
        }
        if self.nranks == 1 || count == 0 {
            if input != output {
                self.gpu.copy(output, input, bytes).map_err(&err)?;
            }
            self.gpu.finish_after_polling(self.gpu_poll).map_err(&err)?;
            return Ok(None);
        }
        let kernel = self.gpu.kernel(T::DTYPE, op).map_err(&err)?;
        let divide_by = if op == ReduceOp::Avg {
            self.nranks as u32
        } else {
            0
        };
        let call = DeviceCall {
            dtype: T::DTYPE,
            kernel: &kernel,
            input,
            output,
            count,
            divide_by,
            registered_input: registered,
        };
        match algorithm {
            Algorithm::Ring => self.run_ring(&call)?,
            Algorithm::OneShot => self.run_one_shot(&call)?,
            Algorithm::Direct => unreachable!("init refuses the direct algorithm"),
        }
        Ok(None)
    }

    /// Exchanges call descriptors and fails every rank, naming the peer,
    /// when they differ.
    fn check_call(&mut self, call: CallDescriptor, registered: bool) -> Result<(), EngineError> {
        let [head, count, chunk] = call.to_words();
        let mine = [head, count, chunk, u64::from(registered)].map(|word| word as i64);
        let mut all = vec![0i64; 4 * self.nranks];
        self.control.all_gather(&mine, &mut all)?;
        for (peer, words) in all.chunks_exact(4).enumerate() {
            let peer_call =
                CallDescriptor::from_words([words[0], words[1], words[2]].map(|word| word as u64));
            if peer_call != Some(call) {
                return Err(EngineError::MismatchedCall {
                    rank: self.rank,
                    call,
                    peer,
                    peer_call: peer_call.unwrap_or(call),
                });
            }
            if words[3] != i64::from(registered) {
                let (here, there) = if registered {
                    ("", "not ")
                } else {
                    ("not ", "")
                };
                return Err(EngineError::MismatchedRegistration {
                    rank: self.rank,
                    peer,
                    detail: format!("the input is {here}registered here, {there}registered there"),
                });
            }
        }
        Ok(())
    }

    /// Waits (asleep) for this rank's queued GPU work, then meets every peer
    /// on the host. A rank whose GPU work failed still comes to the meeting,
    /// so its peers learn it at once instead of timing out.
    fn barrier(&mut self, queued: Result<(), CudaError>) -> Result<(), EngineError> {
        let local = queued.and_then(|()| self.gpu.finish_after_polling(self.gpu_poll));
        let mut failed = [local.as_ref().map_or(self.rank as i64 + 1, |_| 0)];
        self.control
            .all_reduce_in_place(&mut failed, ReduceOp::Max)?;
        local.map_err(cuda(self.rank))?;
        match failed[0] {
            0 => Ok(()),
            rank => Err(EngineError::PeerGpuFailed {
                rank: rank as usize - 1,
            }),
        }
    }

    fn own(&self, offset: usize) -> u64 {
        self.staging.address() + offset as u64
    }

    fn peer(&self, peer: usize, offset: usize) -> u64 {
        self.peer_staging[peer]
            .as_ref()
            .expect("peer-to-peer path: every peer's staging block is open")
            .address()
            + offset as u64
    }

    /// The ring: reduce-scatter then all-gather, 2(N−1) steps, pipelined so
    /// that in iteration i every step k works on chunk i − k − 1 (received
    /// from the predecessor, which produced it in iteration i − 1). One host
    /// barrier per iteration.
    fn run_ring(&mut self, call: &DeviceCall) -> Result<(), EngineError> {
        let (n, r) = (self.nranks, self.rank);
        let predecessor = (r + n - 1) % n;
        let element = call.dtype.size_bytes();
        let steps = 2 * (n - 1);
        let last_reduce = n - 2;
        let segment = |s: usize| part(call.count, n, s);
        // The segment `rank` sends at step k (see the host engine's ring).
        let sent_segment = |rank: usize, k: usize| {
            let back = if k < n - 1 { 1 + k } else { k - (n - 1) };
            (rank + 2 * n - back % n) % n
        };
        let chunk_elements = (self.layout.slot_bytes / element).max(1);
        let chunks = segment(0).len().div_ceil(chunk_elements).max(1);
        let at = |base: u64, element_index: usize| base + (element_index * element) as u64;
        for iteration in 0..chunks + steps {
            let queued = (|| -> Result<(), CudaError> {
                if iteration < chunks && !call.registered_input {
                    let range = clip(&segment(sent_segment(r, 0)), iteration, chunk_elements);
                    self.gpu.copy(
                        self.own(self.layout.slot(0, iteration % 2)),
                        at(call.input, range.start),
                        range.len() * element,
                    )?;
                }
                for k in 0..steps {
                    let Some(chunk) = iteration.checked_sub(k + 1) else {
                        break;
                    };
                    if chunk >= chunks {
                        continue;
                    }
                    let range = clip(
                        &segment(sent_segment(predecessor, k)),
                        chunk,
                        chunk_elements,
                    );
                    if range.is_empty() {
                        continue;
                    }
                    let remote = if k == 0 && call.registered_input {
                        let registration = &self.registered[&call.input];
                        let mapping = registration.peers[predecessor]
                            .as_ref()
                            .expect("registered buffers are open on the peer-to-peer path");
                        at(mapping.address(), range.start)
                    } else {
                        self.peer(predecessor, self.layout.slot(k, (chunk + k) % 2))
                    };
                    // One landing buffer serves every step: the stream runs
                    // each copy and the kernel that reads it before the next.
                    let incoming = match &self.landing {
                        Some(landing) if k <= last_reduce => {
                            self.gpu
                                .copy(landing.address(), remote, range.len() * element)?;
                            landing.address()
                        }
                        _ => remote,
                    };
                    let forward =
                        (k + 1 < steps).then(|| self.own(self.layout.slot(k + 1, iteration % 2)));
                    let (own, out) = (at(call.input, range.start), at(call.output, range.start));
                    let len = range.len();
                    if k < last_reduce {
                        let forward = forward.expect("a reduce step before the last forwards");
                        call.kernel
                            .reduce(&self.gpu, call.dtype, forward, None, incoming, own, len, 0)?;
                    } else if k == last_reduce {
                        call.kernel.reduce(
                            &self.gpu,
                            call.dtype,
                            out,
                            forward,
                            incoming,
                            own,
                            len,
                            call.divide_by,
                        )?;
                    } else {
                        self.gpu.copy(out, incoming, len * element)?;
                        if let Some(forward) = forward {
                            self.gpu.copy(forward, incoming, len * element)?;
                        }
                    }
                }
                Ok(())
            })();
            self.barrier(queued)?;
        }
        Ok(())
    }

    /// Small messages: every rank copies its input to a one-shot buffer, the
    /// ranks meet, and each reduces all N buffers in rank order in one
    /// kernel. The two buffers alternate, so a round's buffer is rewritten
    /// only after the next round's meeting, by which time every reader's GPU
    /// has finished with it.
    fn run_one_shot(&mut self, call: &DeviceCall) -> Result<(), EngineError> {
        let element = call.dtype.size_bytes();
        let window_elements = (self.layout.one_shot_bytes / element).max(1);
        let rounds = call.count.div_ceil(window_elements).max(1);
        for round in 0..rounds {
            let range = clip(&(0..call.count), round, window_elements);
            let parity = self.one_shot_parity;
            self.one_shot_parity ^= 1;
            let offset = self.layout.one_shot(parity);
            let start = (range.start * element) as u64;
            let queued = self
                .gpu
                .copy(self.own(offset), call.input + start, range.len() * element);
            self.barrier(queued)?;
            let sources: Vec<u64> = (0..self.nranks)
                .map(|owner| {
                    if owner == self.rank {
                        self.own(offset)
                    } else {
                        self.peer(owner, offset)
                    }
                })
                .collect();
            call.kernel
                .one_shot(
                    &self.gpu,
                    call.dtype,
                    call.output + start,
                    &sources,
                    range.len(),
                    call.divide_by,
                )
                .and_then(|()| self.gpu.finish_after_polling(self.gpu_poll))
                .map_err(cuda(self.rank))?;
        }
        Ok(())
    }
}

/// One all_reduce on the peer-to-peer path.
struct DeviceCall<'a> {
    dtype: DType,
    kernel: &'a Kernel,
    input: u64,
    output: u64,
    count: usize,
    /// The rank count for avg, else 0.
    divide_by: u32,
    /// Whether step 0 reads the predecessor's input buffer directly.
    registered_input: bool,
}
