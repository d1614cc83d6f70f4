//! The communicator: N ranks in separate processes, the collectives, and the
//! waiting discipline that turns a dead, hung or mismatched peer into an error
//! naming it.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::algorithm::{Algorithm, AlgorithmChoice};
use super::call::{CallDescriptor, CallKind};
use super::chunk::{ChunkPolicy, LinkFacts};
use super::dtype::{combine, finish_avg, Element, ReduceOp};
use super::error::EngineError;
use super::failure::Failure;
use super::link_events::LinkEvents;
use super::rendezvous;
use super::shm::{self, ShmTransport};
use super::transport::{Signal, Transport, TransportKind, Window, WindowSizes};
use super::transport_pcieipc::PcieipcTransport;

/// How long a waiting rank that is not bound to a CPU polls before it starts
/// yielding its core between polls.
const EAGER_SPIN: Duration = Duration::from_micros(2);
/// Every Raw and Relay slot and one-shot window starts with its writer's call
/// number and call descriptor (four words), then the data: for small
/// messages stamp and data share a cache line, one transfer between cores.
const MESSAGE_HEADER_BYTES: usize = 32;

/// How often a rank that follows its device's link reads the module's events:
/// a non-blocking read, kept off the path of back-to-back small calls.
const LINK_EVENTS_PERIOD: Duration = Duration::from_millis(1);

/// How long a read of a live peer's memory may keep failing before the peer's
/// buffer counts as unreadable: long enough for a peer that is tearing down
/// (its buffers freed a moment before its communicator) to show as departed
/// or dead first.
const UNREADABLE_GRACE: Duration = Duration::from_millis(20);

/// The piece the direct algorithm reads from one peer and reduces before the
/// next: small enough to stay in the core's cache between the two.
const DIRECT_PIECE_BYTES: usize = 256 << 10;

/// How long a blocked rank sleeps between liveness and timeout checks: the
/// bound on how late a dead peer is noticed, and few enough wake-ups that a
/// rank waiting for a late peer costs next to no CPU.
const LIVENESS_SLICE: Duration = Duration::from_millis(10);

/// Everything a rank chooses when it joins. Rank 0's window sizes (chunk
/// policy's largest chunk, `in_flight`, `one_shot_read_budget`) are the ones the
/// segment is built with; the per-call choices are checked across ranks.
#[derive(Clone, Debug)]
pub struct CommOptions {
    pub transport: TransportKind,
    /// How long the rendezvous waits for every rank.
    pub join_timeout: Duration,
    /// How long a rank waits on one peer inside a collective before it names
    /// that peer (or the peer that one waits for) as unresponsive.
    pub peer_timeout: Duration,
    /// How long a waiting rank polls before it sleeps on the futex: a short
    /// spin hides the wake-up latency when the peer is only slightly late.
    pub spin: Duration,
    pub chunk_policy: ChunkPolicy,
    /// The link under this rank's ring hop at init (`None`: host memory),
    /// changed later with `set_link`. The pcieipc transport follows its
    /// device's link instead, through the module's events.
    pub link: Option<LinkFacts>,
    /// How many chunks each ring step may run ahead of the next (the slack
    /// between neighbours); the windows hold in_flight + 1 chunks per step.
    pub in_flight: usize,
    pub algorithm: AlgorithmChoice,
    /// The most bytes a rank reads from its peers on the one-shot path:
    /// all_reduce of `bytes` goes one-shot while bytes·(N−1) fits.
    pub one_shot_read_budget: usize,
    /// Binds the calling thread to this CPU at init, as MPI launchers bind
    /// ranks to cores: two ranks time-sharing one core turn every wait into a
    /// context switch.
    pub bind_cpu: Option<usize>,
    /// The pcieipc transport's device: this index of /dev/pcieipc; `None`
    /// takes the rank-th bound ivshmem-doorbell device.
    pub pcieipc_device: Option<u32>,
    /// shm: let the ring's all-gather copy each finished chunk once, straight
    /// from the predecessor's output with `process_vm_readv`, where every
    /// rank may read its predecessor's memory (probed at init; all ranks
    /// agree). False on any rank: every rank copies twice, through the relay
    /// slots. Other transports always use the relay slots.
    pub single_copy: bool,
    /// The all_reduce (and reduce_scatter, all_gather) message sizes, in
    /// bytes of the whole buffer, that take the single-copy path where it is
    /// on: elsewhere the relay slots measured faster on the 2-core
    /// development VM (docs/engine.md). Must be the same on every rank
    /// (checked at init: ranks that differ all fall back to the relay slots).
    pub single_copy_messages: std::ops::RangeInclusive<usize>,
    /// The all_reduce message sizes, in bytes, that the automatic choice
    /// sends by the direct algorithm where single-copy reads are on (each
    /// rank reduces its own segment from every peer's input, then copies the
    /// others' from their owners): measured ahead of the ring from 4 MiB to
    /// 16 MiB on the development VM (docs/engine.md). Agreed at init like
    /// `single_copy_messages`.
    pub direct_messages: std::ops::RangeInclusive<usize>,
}

impl Default for CommOptions {
    fn default() -> CommOptions {
        CommOptions {
            transport: TransportKind::Shm,
            join_timeout: Duration::from_secs(30),
            peer_timeout: Duration::from_secs(60),
            spin: Duration::from_micros(50),
            chunk_policy: ChunkPolicy::default(),
            link: None,
            in_flight: 4,
            algorithm: AlgorithmChoice::Auto,
            one_shot_read_budget: 64 << 10,
            bind_cpu: None,
            pcieipc_device: None,
            single_copy: true,
            single_copy_messages: (2 << 20)..=(16 << 20),
            direct_messages: (4 << 20)..=(16 << 20),
        }
    }
}

/// The two streams a rank sends to its successor and receives from its
/// predecessor, with this rank's counts of each.
#[derive(Clone, Copy)]
enum Stream {
    Raw,
    Relay,
}

#[derive(Default)]
struct StreamCounts {
    sent: u32,
    received: u32,
}

/// The buffers of one call. In place, the rank's own contribution is read from
/// the same memory the result is written to.
enum Buffers<'a, T> {
    InPlace(&'a mut [T]),
    OutOfPlace { input: &'a [T], output: &'a mut [T] },
}

impl<T> Buffers<'_, T> {
    fn input(&self) -> &[T] {
        match self {
            Buffers::InPlace(buffer) => buffer,
            Buffers::OutOfPlace { input, .. } => input,
        }
    }

    fn output(&mut self) -> &mut [T] {
        match self {
            Buffers::InPlace(buffer) => buffer,
            Buffers::OutOfPlace { output, .. } => output,
        }
    }
}

/// Which ring collective, and so which segments each step moves.
#[derive(Clone, Copy)]
enum RingCall {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
}

pub struct Communicator {
    transport: Box<dyn Transport>,
    rank: usize,
    nranks: usize,
    options: CommOptions,
    /// The pcieipc transport's device link, polled between calls.
    link_events: Option<LinkEvents>,
    /// When `link_events` was last polled.
    link_events_polled: Instant,
    /// Calls started so far; the current call's number while one runs.
    calls: u64,
    raw: StreamCounts,
    relay: StreamCounts,
    /// Rounds posted on this rank's one-shot counter: one-shot windows, and
    /// the direct algorithm's three meetings per call.
    one_shot_rounds: u32,
    /// Where the direct algorithm lands each piece it reads from a peer,
    /// kept between calls.
    direct_scratch: Vec<u64>,
    /// Whether the stamp on this call's first message from the predecessor
    /// has been checked against our call.
    predecessor_checked: bool,
    current_call: Option<CallDescriptor>,
    last_call: Option<CallDescriptor>,
    init_time: Duration,
    /// Whether the ring's all-gather reads finished chunks straight from the
    /// predecessor's output (`process_vm_readv`), for messages in
    /// `options.single_copy_messages`: agreed by all ranks at init.
    single_copy: bool,
}

/// Element range `s` of `count` split into `parts` near-equal parts (the first
/// `count % parts` one longer).
pub(super) fn part(count: usize, parts: usize, s: usize) -> Range<usize> {
    let (base, extra) = (count / parts, count % parts);
    let start = s * base + s.min(extra);
    start..start + base + usize::from(s < extra)
}

pub(super) fn clip(range: &Range<usize>, chunk: usize, chunk_elements: usize) -> Range<usize> {
    let start = (range.start + chunk * chunk_elements).min(range.end);
    start..(start + chunk_elements).min(range.end)
}

fn bind_to_cpu(cpu: usize) -> Result<(), EngineError> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(EngineError::BindCpu {
            cpu,
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    // SAFETY: cpu_set_t is plain data, zero is the empty set, CPU_SET is given
    // an index below CPU_SETSIZE, and sched_setaffinity reads exactly one set.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if result != 0 {
        return Err(EngineError::BindCpu {
            cpu,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Lets any process of ours read this one's memory under Yama's
/// ptrace_scope 1 (without Yama the call fails, and nothing needs allowing).
fn allow_peer_reads() {
    // SAFETY: PR_SET_PTRACER takes a pid or PR_SET_PTRACER_ANY and touches
    // no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
    }
}

/// Copies `local.len()` bytes at `remote` in process `pid` into `local`.
fn read_process(pid: u32, remote: u64, local: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < local.len() {
        let local_iov = libc::iovec {
            iov_base: local[done..].as_mut_ptr().cast(),
            iov_len: local.len() - done,
        };
        let remote_iov = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: local.len() - done,
        };
        // SAFETY: the local iovec covers the rest of `local`, which we hold
        // mutably; the remote one is only read, by the kernel, which checks it.
        let read =
            unsafe { libc::process_vm_readv(pid as libc::pid_t, &local_iov, 1, &remote_iov, 1, 0) };
        match read {
            ..0 => return Err(std::io::Error::last_os_error()),
            0 => return Err(std::io::Error::from_raw_os_error(libc::EFAULT)),
            read => done += read as usize,
        }
    }
    Ok(())
}

/// Posts `rank`'s next round on its one-shot counter (`rounds`, this rank's
/// count of them).
fn post_round(transport: &dyn Transport, rank: usize, rounds: &mut u32) {
    *rounds = rounds.wrapping_add(1);
    transport.store(rank, Signal::OneShotPosted, *rounds);
}

impl Communicator {
    /// Joins the communicator `rendezvous` (a job-unique name) as `rank` of
    /// `nranks`. Returns once every rank has joined and the transport is up.
    pub fn init(
        rendezvous: &str,
        rank: usize,
        nranks: usize,
        options: CommOptions,
    ) -> Result<Communicator, EngineError> {
        let started = Instant::now();
        if nranks == 0 {
            return Err(EngineError::NoRanks);
        }
        if rank >= nranks {
            return Err(EngineError::RankOutOfRange { rank, nranks });
        }
        if let Some(cpu) = options.bind_cpu {
            bind_to_cpu(cpu)?;
        }
        let in_flight = options.in_flight.max(1);
        // Steps after the first that one chunk makes: 2(N−1) − 1 for all_reduce.
        let relay_steps = (2 * nranks).saturating_sub(3).max(1);
        let requested = shm::page_aligned(WindowSizes {
            slot_bytes: MESSAGE_HEADER_BYTES + options.chunk_policy.max_chunk_bytes(),
            raw_slots: in_flight + 1,
            relay_slots: (in_flight + 1) * relay_steps,
            // A message at the budget fits one window, stamp included.
            one_shot_bytes: MESSAGE_HEADER_BYTES + options.one_shot_read_budget,
        });
        let mut link_events = None;
        let transport: Box<dyn Transport> = match options.transport {
            TransportKind::Shm => {
                let joined = if rank == 0 {
                    rendezvous::host(rendezvous, nranks, requested, options.join_timeout, || {
                        Ok(())
                    })?
                    .0
                } else {
                    rendezvous::join(rendezvous, rank, nranks, options.join_timeout)?
                };
                Box::new(ShmTransport::attach(
                    joined.segment,
                    rank,
                    joined.sizes,
                    joined.pids,
                )?)
            }
            // Rank 0 must prepare its device's region before it admits anyone,
            // so this transport runs the rendezvous itself.
            TransportKind::Pcieipc => {
                let transport = PcieipcTransport::init(
                    rendezvous,
                    rank,
                    nranks,
                    requested,
                    options.pcieipc_device,
                    options.join_timeout,
                )?;
                link_events = transport.link_events()?;
                Box::new(transport)
            }
        };
        let link = link_events
            .as_ref()
            .map_or(options.link, |events: &LinkEvents| Some(events.facts()));
        // Rank 0's choice: the windows were sized with it.
        let in_flight = transport.sizes().raw_slots - 1;
        let mut communicator = Communicator {
            transport,
            rank,
            nranks,
            options: CommOptions {
                in_flight,
                ..options
            },
            link_events,
            link_events_polled: Instant::now(),
            calls: 0,
            raw: StreamCounts::default(),
            relay: StreamCounts::default(),
            one_shot_rounds: 0,
            direct_scratch: Vec::new(),
            predecessor_checked: false,
            current_call: None,
            last_call: None,
            init_time: Duration::ZERO,
            single_copy: false,
        };
        communicator.set_link(link);
        communicator.single_copy = communicator.agree_on_single_copy()?;
        communicator.init_time = started.elapsed();
        Ok(communicator)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// How long `init` took, rendezvous and transport set-up included.
    pub fn init_time(&self) -> Duration {
        self.init_time
    }

    pub fn transport_kind(&self) -> TransportKind {
        self.transport.kind()
    }

    /// Whether the ring's all-gather copies once (for messages in
    /// `CommOptions::single_copy_messages`), each rank reading finished
    /// chunks straight from its predecessor's output with `process_vm_readv`
    /// (shm, where every rank could read its predecessor's memory at init),
    /// or twice, through the relay slots. Every rank of a communicator
    /// reports the same.
    pub fn single_copy(&self) -> bool {
        self.single_copy
    }

    /// The message sizes (bytes of the whole buffer) that take the
    /// single-copy path while `single_copy()` holds.
    pub fn single_copy_messages(&self) -> std::ops::RangeInclusive<usize> {
        self.options.single_copy_messages.clone()
    }

    /// The all_reduce message sizes the automatic choice sends direct while
    /// `single_copy()` holds.
    pub fn direct_messages(&self) -> std::ops::RangeInclusive<usize> {
        self.options.direct_messages.clone()
    }

    /// The last call this rank made, with the chunk size it moved in.
    pub fn last_call(&self) -> Option<CallDescriptor> {
        self.last_call
    }

    /// Publishes a changed link (after a link or AER event) for the chunk
    /// sizes of the next calls. Any rank may call it between any two of its
    /// calls, alone: each call's chunk is decided by one rank from every
    /// rank's published link and adopted by the others, so a change takes
    /// effect at the same call on every rank (the next call that rank decides).
    pub fn set_link(&mut self, link: Option<LinkFacts>) {
        self.options.link = link;
        self.transport.publish_link(link);
    }

    /// Changes how the next all_reduce calls pick their algorithm. Every rank
    /// must make the same change between the same calls: the algorithm is
    /// part of what the ranks check against each other.
    pub fn set_algorithm(&mut self, algorithm: AlgorithmChoice) {
        self.options.algorithm = algorithm;
    }

    /// The algorithm an all_reduce of `count` elements of `T` takes. The
    /// automatic choice sends `direct_messages` sizes direct where ranks may
    /// read each other's memory (`single_copy()`); a fixed direct choice
    /// without that fails the call with `AlgorithmUnavailable`.
    pub fn algorithm_for<T: Element>(&self, count: usize) -> Algorithm {
        let bytes = count * std::mem::size_of::<T>();
        match self
            .options
            .algorithm
            .pick(bytes, self.nranks, self.options.one_shot_read_budget)
        {
            Algorithm::Ring
                if self.options.algorithm == AlgorithmChoice::Auto
                    && self.single_copy
                    && self.options.direct_messages.contains(&bytes) =>
            {
                Algorithm::Direct
            }
            algorithm => algorithm,
        }
    }

    /// `output[i]` = `op` over all ranks' `input[i]`.
    pub fn all_reduce<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        EngineError::check_length("all_reduce output", output.len(), input.len())?;
        self.all_reduce_buffers(Buffers::OutOfPlace { input, output }, op)
    }

    /// `buffer[i]` = `op` over all ranks' `buffer[i]`.
    pub fn all_reduce_in_place<T: Element>(
        &mut self,
        buffer: &mut [T],
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        self.all_reduce_buffers(Buffers::InPlace(buffer), op)
    }

    /// Rank r's `output` = `op` over all ranks' `input[r·m..(r+1)·m]`, where
    /// m = `output.len()` and `input.len()` = N·m.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        EngineError::check_length(
            "reduce_scatter input (N × output)",
            input.len(),
            output.len() * self.nranks,
        )?;
        let call = self.begin(
            CallKind::ReduceScatter,
            T::DTYPE,
            Some(op),
            output.len(),
            0,
            Algorithm::Ring,
        )?;
        let result = self.run_ring(
            call,
            RingCall::ReduceScatter(op),
            Buffers::OutOfPlace { input, output },
        );
        self.end(result)
    }

    /// `output[r·m..(r+1)·m]` = rank r's `input`, where m = `input.len()` and
    /// `output.len()` = N·m.
    pub fn all_gather<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
    ) -> Result<(), EngineError> {
        EngineError::check_length(
            "all_gather output (N × input)",
            output.len(),
            input.len() * self.nranks,
        )?;
        let call = self.begin(
            CallKind::AllGather,
            T::DTYPE,
            None,
            input.len(),
            0,
            Algorithm::Ring,
        )?;
        let result = self.run_ring(
            call,
            RingCall::AllGather,
            Buffers::OutOfPlace { input, output },
        );
        self.end(result)
    }

    /// Every rank's `buffer` = rank `root`'s, passed along the ring from the root.
    pub fn broadcast<T: Element>(
        &mut self,
        buffer: &mut [T],
        root: usize,
    ) -> Result<(), EngineError> {
        if root >= self.nranks {
            return Err(EngineError::RootOutOfRange {
                root,
                nranks: self.nranks,
            });
        }
        let call = self.begin(
            CallKind::Broadcast,
            T::DTYPE,
            None,
            buffer.len(),
            root,
            Algorithm::Ring,
        )?;
        let result = if self.nranks == 1 {
            Ok(())
        } else {
            self.run_broadcast(call, buffer, root)
        };
        self.end(result)
    }

    fn all_reduce_buffers<T: Element>(
        &mut self,
        mut buffers: Buffers<T>,
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        let count = buffers.input().len();
        let algorithm = self.algorithm_for::<T>(count);
        if algorithm == Algorithm::Direct && !self.single_copy {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm,
                reason: "ranks may not read each other's memory (the shm transport, with \
                         process_vm_readv allowed between all ranks and single-copy on)",
            });
        }
        let call = self.begin(CallKind::AllReduce, T::DTYPE, Some(op), count, 0, algorithm)?;
        let result = if self.nranks == 1 {
            if let Buffers::OutOfPlace { input, output } = &mut buffers {
                output.copy_from_slice(input);
            }
            Ok(())
        } else {
            match algorithm {
                Algorithm::Ring => self.run_ring(call, RingCall::AllReduce(op), buffers),
                Algorithm::OneShot => self.run_one_shot(call, op, buffers),
                Algorithm::Direct => self.run_direct(call, op, buffers),
            }
        };
        self.end(result)
    }

    /// Starts call number `self.calls`: refuses if the communicator has failed,
    /// settles the chunk size, and publishes the call for the peers to check.
    ///
    /// One rank decides each call's chunk, the smallest that any rank's
    /// published link asks for: rank 0 for the ring calls, whose descriptor
    /// the others wait for and adopt (rank 0 cannot finish a ring call before
    /// every rank has begun it, so its descriptor is still there), and the root
    /// for a broadcast, whose chunk reaches the others on its messages' stamps
    /// (a root can run calls ahead of the chain).
    fn begin(
        &mut self,
        kind: CallKind,
        dtype: super::dtype::DType,
        op: Option<ReduceOp>,
        count: usize,
        root: usize,
        algorithm: Algorithm,
    ) -> Result<CallDescriptor, EngineError> {
        if let Some(failure) = self.transport.failure() {
            return Err(failure.into());
        }
        self.follow_link_events();
        let mut call = CallDescriptor {
            kind,
            dtype,
            op,
            count: count as u64,
            root: root as u32,
            algorithm,
            chunk_bytes: 0,
        };
        // reduce_scatter's and all_gather's count is one rank's share.
        let message_bytes = match kind {
            CallKind::ReduceScatter | CallKind::AllGather => count * self.nranks,
            CallKind::AllReduce | CallKind::Broadcast => count,
        } * dtype.size_bytes();
        let decider = match kind {
            CallKind::Broadcast => root,
            _ => 0,
        };
        if algorithm == Algorithm::Ring {
            if self.rank == decider {
                call.chunk_bytes = self.decide_chunk(message_bytes, dtype.size_bytes());
            } else if kind != CallKind::Broadcast {
                call.chunk_bytes = self.adopt_chunk(call, message_bytes)?;
            }
        }
        self.transport.publish_call(self.calls, call);
        if self.rank == 0 {
            self.transport
                .store(0, Signal::CallsPublished, (self.calls + 1) as u32);
        }
        self.current_call = Some(call);
        self.predecessor_checked = false;
        Ok(call)
    }

    fn end(&mut self, result: Result<(), EngineError>) -> Result<(), EngineError> {
        self.calls += 1;
        self.last_call = self.current_call.take();
        result
    }

    /// Publishes the device link's changes since the last poll (pcieipc).
    fn follow_link_events(&mut self) {
        let Some(events) = &mut self.link_events else {
            return;
        };
        if self.link_events_polled.elapsed() < LINK_EVENTS_PERIOD {
            return;
        }
        self.link_events_polled = Instant::now();
        if let Some(link) = events.poll() {
            self.set_link(Some(link));
        }
    }

    /// The chunk for a message of `message_bytes`: the smallest any rank's
    /// link asks for, within what a slot holds, in whole elements.
    fn decide_chunk(&self, message_bytes: usize, element_bytes: usize) -> u32 {
        let slot_capacity = self.transport.sizes().slot_bytes - MESSAGE_HEADER_BYTES;
        let policy = &self.options.chunk_policy;
        let wished = (0..self.nranks)
            .map(|rank| {
                let link = self.transport.published_link(rank);
                policy.chunk_bytes(link.as_ref(), message_bytes)
            })
            .min()
            .unwrap_or(slot_capacity)
            .clamp(64, slot_capacity);
        (wished / element_bytes * element_bytes) as u32
    }

    /// Waits for rank 0 to publish this call and returns the chunk size it
    /// decided; a different call there is a mismatch.
    fn adopt_chunk(
        &mut self,
        call: CallDescriptor,
        message_bytes: usize,
    ) -> Result<u32, EngineError> {
        self.wait_for(0, 0, Signal::CallsPublished, (self.calls + 1) as u32)?;
        match self.transport.published_call(0, self.calls) {
            Some(decided) if decided.same_call(&call) => Ok(decided.chunk_bytes),
            Some(peer_call) => Err(self.abort_mismatch(call, 0, peer_call)),
            // Rank 0 already runs a later call, which only a call that needs
            // nothing from this rank lets it do (a broadcast from rank 0): the
            // calls differ, which the stamp on the first message received
            // reports. Until then any chunk does.
            None => Ok(self.decide_chunk(message_bytes, call.dtype.size_bytes())),
        }
    }

    /// Decides, with every other rank, whether the ring's all-gather reads
    /// straight from the predecessor's memory. Each rank publishes a probe
    /// word (its own address in its process), reads its predecessor's back
    /// with `process_vm_readv`, and posts whether that worked; the path is
    /// single-copy only if it worked for every rank. Under Yama's
    /// ptrace_scope 1 a peer may only read us once we allow it, which the
    /// rank does first; ptrace_scope 2 or 3, a container's seccomp policy or a
    /// rank started with `single_copy: false` make every rank fall back to
    /// the relay slots.
    fn agree_on_single_copy(&mut self) -> Result<bool, EngineError> {
        if self.nranks == 1 || self.transport.kind() != TransportKind::Shm {
            return Ok(false);
        }
        let messages = [
            *self.options.single_copy_messages.start() as u64,
            *self.options.single_copy_messages.end() as u64,
            *self.options.direct_messages.start() as u64,
            *self.options.direct_messages.end() as u64,
        ];
        let willing = self.options.single_copy && {
            allow_peer_reads();
            self.transport.publish_probe(messages)
        };
        self.transport
            .store(self.rank, Signal::Probed, if willing { 1 } else { 3 });
        let predecessor = self.predecessor();
        let mut able = false;
        if willing {
            self.wait_for(predecessor, predecessor, Signal::Probed, 1)?;
            let (address, _) = self.transport.probe(predecessor);
            if self.transport.load(predecessor, Signal::Probed) != 3 && address != 0 {
                let mut word = [0u8; 8];
                able = read_process(self.transport.pid(predecessor), address, &mut word).is_ok()
                    && u64::from_ne_bytes(word) == address;
            }
        }
        self.transport
            .store(self.rank, Signal::Probed, if able { 2 } else { 3 });
        let mut everyone = able;
        for peer in (0..self.nranks).filter(|peer| *peer != self.rank) {
            self.wait_for(peer, peer, Signal::Probed, 2)?;
            everyone &= self.transport.load(peer, Signal::Probed) == 2
                && self.transport.probe(peer).1 == messages;
        }
        Ok(everyone)
    }

    /// Reads `output.len()` elements at `address` in `owner`'s process into
    /// `output`. The owner keeps that memory as it is until we say we are
    /// done with it (the ring's all-gather: by acknowledging the message that
    /// named it; direct: by posting the call's next round). A read that fails
    /// usually means the owner is exiting (`ESRCH` once its memory is gone):
    /// the liveness checks then name it, as they do for any wait. A live
    /// owner whose memory still cannot be read after `UNREADABLE_GRACE`
    /// (`EFAULT`: a buffer in a device mapping, which the kernel will not
    /// pin) fails the job at once with `PeerMemoryUnreadable`, instead of
    /// after `peer_timeout` as an unresponsive peer it is not.
    fn read_peer<T: Element>(
        &self,
        owner: usize,
        address: u64,
        output: &mut [T],
    ) -> Result<(), EngineError> {
        // SAFETY: any bit pattern is a valid `Element` (plain numbers), so
        // the output may be written as bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                output.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(output),
            )
        };
        let pid = self.transport.pid(owner);
        let Err(mut error) = read_process(pid, address, bytes) else {
            return Ok(());
        };
        let transport = &*self.transport;
        let started = Instant::now();
        loop {
            if let Some(failure) = transport.failure() {
                return Err(failure.into());
            }
            if let Some((rank, pid)) = transport
                .dead_peers()
                .into_iter()
                .find(|(rank, _)| !transport.departed(*rank))
            {
                return Err(transport.abort(Failure::PeerDied { rank, pid }).into());
            }
            if transport.departed(owner) {
                return Err(transport.abort(Failure::PeerLeft { rank: owner }).into());
            }
            let waited = started.elapsed();
            let errno = error.raw_os_error().unwrap_or(0);
            if errno != libc::ESRCH && waited >= UNREADABLE_GRACE {
                return Err(transport
                    .abort(Failure::PeerMemoryUnreadable {
                        rank: self.rank,
                        owner,
                        errno,
                    })
                    .into());
            }
            if waited >= self.options.peer_timeout {
                return Err(transport
                    .abort(Failure::PeerUnresponsive {
                        rank: owner,
                        waited,
                    })
                    .into());
            }
            std::thread::sleep(Duration::from_millis(1));
            match read_process(pid, address, bytes) {
                Ok(()) => return Ok(()),
                Err(again) => error = again,
            }
        }
    }

    /// Sends the address of `chunk` (finished, in this rank's output) on the
    /// relay stream, for the successor to read in place.
    fn send_address<T>(&mut self, chunk: &[T]) -> Result<(), EngineError> {
        let slot = self.send_slot::<i64>(Stream::Relay, 1)?;
        slot[0] = chunk.as_ptr() as i64;
        Ok(())
    }

    fn successor(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    fn predecessor(&self) -> usize {
        (self.rank + self.nranks - 1) % self.nranks
    }

    /// Compares `peer`'s published descriptor of the current call with ours.
    fn check_call(&self, peer: usize) -> Result<(), EngineError> {
        let Some(call) = self.current_call else {
            return Ok(());
        };
        match self.transport.published_call(peer, self.calls) {
            Some(peer_call) if !peer_call.same_call(&call) => {
                Err(self.abort_mismatch(call, peer, peer_call))
            }
            _ => Ok(()),
        }
    }

    /// Writes the current call's stamp at the start of a slot or window this
    /// rank is about to publish.
    fn stamp(&self, window: *mut u8) {
        let call = self
            .current_call
            .expect("stamps are only written inside a call");
        let [head, count, chunk_bytes] = call.to_words();
        let stamp = [self.calls, head, count, chunk_bytes];
        // SAFETY: the stamp fills the first MESSAGE_HEADER_BYTES of a page
        // aligned slot or window that is ours until we publish it.
        unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), window.cast::<u64>(), stamp.len()) };
    }

    /// Compares the stamp `peer` wrote on a slot or window it published with
    /// our call, and returns the peer's call (with the chunk size it moves
    /// in). The stamp travels with the data, so this holds however many calls
    /// ahead the peer has run (a broadcast chain lets it run ahead).
    fn check_stamp(&self, peer: usize, window: *mut u8) -> Result<CallDescriptor, EngineError> {
        let call = self
            .current_call
            .expect("stamps are only checked inside a call");
        let mut stamp = [0u64; 4];
        // SAFETY: the peer wrote the stamp before publishing, and does not
        // touch the slot or window until we are done with it.
        unsafe {
            std::ptr::copy_nonoverlapping(window.cast::<u64>().cast_const(), stamp.as_mut_ptr(), 4)
        };
        let peer_call = CallDescriptor::from_words([stamp[1], stamp[2], stamp[3]]);
        if let Some(peer_call) =
            peer_call.filter(|peer_call| stamp[0] == self.calls && peer_call.same_call(&call))
        {
            return Ok(peer_call);
        }
        // A stamp that does not decode, or the same call under another call
        // number, means the peer's sequence of calls diverged from ours.
        Err(self.abort_mismatch(call, peer, peer_call.unwrap_or(call)))
    }

    /// Records that `peer` made `peer_call` where this rank made `call`, and
    /// returns the failure that stands (another may have been recorded first).
    fn abort_mismatch(
        &self,
        call: CallDescriptor,
        peer: usize,
        peer_call: CallDescriptor,
    ) -> EngineError {
        self.transport
            .abort(Failure::MismatchedCall {
                rank: self.rank,
                call,
                peer,
                peer_call,
            })
            .into()
    }

    /// The rank at the end of the chain of ranks blocked on each other that
    /// starts at `peer`: the one actually not making progress.
    fn culprit(&self, peer: usize) -> usize {
        let mut culprit = peer;
        for _ in 0..self.nranks {
            match self.transport.blocked_on(culprit) {
                Some(next) if next != self.rank && next != culprit => culprit = next,
                _ => break,
            }
        }
        culprit
    }

    /// Waits until `owner`'s `signal` reaches `target` (wrapping), which `peer`
    /// is to bring about: a bounded spin, then futex sleeps in slices between
    /// which failures, dead or departed peers, mismatched calls and the
    /// timeout are checked.
    fn wait_for(
        &self,
        peer: usize,
        owner: usize,
        signal: Signal,
        target: u32,
    ) -> Result<(), EngineError> {
        let reached = |value: u32| value.wrapping_sub(target) as i32 >= 0;
        let transport = &*self.transport;
        let mut value = transport.load(owner, signal);
        if reached(value) {
            return Ok(());
        }
        let started = Instant::now();
        // Poll back to back (a peer on another core is usually about to
        // post). An unbound rank then yields between polls, since on an
        // oversubscribed host its peer may be queued on this very core; a
        // bound rank's peer never is, and yielding would only hand the core
        // to an unrelated task for a whole scheduler slice.
        let yield_after = match self.options.bind_cpu {
            Some(_) => self.options.spin,
            None => EAGER_SPIN,
        };
        loop {
            let spun = started.elapsed();
            if spun >= self.options.spin {
                break;
            }
            if spun < yield_after {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            value = transport.load(owner, signal);
            if reached(value) {
                return Ok(());
            }
        }
        transport.set_blocked_on(Some(peer));
        let outcome = loop {
            // A peer may post what we need and then leave or exit: what it
            // posted stays readable, so progress is checked before failures.
            value = transport.load(owner, signal);
            if reached(value) {
                break Ok(());
            }
            if let Some(failure) = transport.failure() {
                break Err(failure.into());
            }
            if let Err(mismatch) = self.check_call(peer) {
                break Err(mismatch);
            }
            // A rank that exited after dropping its communicator finished
            // cleanly; one that exited without doing so died mid-job.
            let died = transport
                .dead_peers()
                .into_iter()
                .find(|(rank, _)| !transport.departed(*rank));
            if let Some((rank, pid)) = died {
                break Err(transport.abort(Failure::PeerDied { rank, pid }).into());
            }
            if transport.departed(peer) {
                // It may have posted what we wait for after our load above and
                // then left (a rank returns from its last call without waiting
                // for its successor to read): the departure, seen here,
                // publishes that post.
                if reached(transport.load(owner, signal)) {
                    break Ok(());
                }
                break Err(transport.abort(Failure::PeerLeft { rank: peer }).into());
            }
            let waited = started.elapsed();
            if waited >= self.options.peer_timeout {
                let rank = self.culprit(peer);
                break Err(transport
                    .abort(Failure::PeerUnresponsive { rank, waited })
                    .into());
            }
            transport.sleep(
                owner,
                signal,
                value,
                LIVENESS_SLICE.min(self.options.peer_timeout - waited),
            );
        };
        transport.set_blocked_on(None);
        outcome
    }

    fn slots(&self, stream: Stream) -> u32 {
        let sizes = self.transport.sizes();
        match stream {
            Stream::Raw => sizes.raw_slots as u32,
            Stream::Relay => sizes.relay_slots as u32,
        }
    }

    fn counts(&mut self, stream: Stream) -> &mut StreamCounts {
        match stream {
            Stream::Raw => &mut self.raw,
            Stream::Relay => &mut self.relay,
        }
    }

    fn window_of(stream: Stream, slot: u32) -> Window {
        let slot = slot as usize;
        match stream {
            Stream::Raw => Window::Raw { slot },
            Stream::Relay => Window::Relay { slot },
        }
    }

    fn signals(stream: Stream) -> (Signal, Signal) {
        match stream {
            Stream::Raw => (Signal::RawPosted, Signal::RawConsumed),
            Stream::Relay => (Signal::RelayPosted, Signal::RelayConsumed),
        }
    }

    /// Waits for this rank's next slot on `stream` to be free and returns it
    /// for `len` elements.
    fn send_slot<T: Element>(
        &mut self,
        stream: Stream,
        len: usize,
    ) -> Result<&mut [T], EngineError> {
        let slots = self.slots(stream);
        let sent = self.counts(stream).sent;
        let (_, consumed) = Self::signals(stream);
        self.wait_for(
            self.successor(),
            self.rank,
            consumed,
            sent.wrapping_add(1).wrapping_sub(slots),
        )?;
        let window = self
            .transport
            .window(self.rank, Self::window_of(stream, sent % slots));
        // SAFETY: the slot holds a header and `slot_bytes` − header ≥ a chunk,
        // is page aligned, and the successor has consumed what it held: until
        // `post`, only we touch it.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(window.add(MESSAGE_HEADER_BYTES).cast::<T>(), len)
        })
    }

    /// Stamps the slot filled since `send_slot` with the current call and
    /// hands it to the successor.
    fn post(&mut self, stream: Stream) {
        let sent = self.counts(stream).sent;
        let window = self.transport.window(
            self.rank,
            Self::window_of(stream, sent % self.slots(stream)),
        );
        self.stamp(window);
        let counts = self.counts(stream);
        counts.sent = counts.sent.wrapping_add(1);
        let sent = counts.sent;
        let (posted, _) = Self::signals(stream);
        self.transport.store(self.rank, posted, sent);
    }

    /// Waits for the predecessor's next message on `stream` and returns the
    /// slot that holds it.
    fn next_from_predecessor(&mut self, stream: Stream) -> Result<*mut u8, EngineError> {
        let predecessor = self.predecessor();
        let received = self.counts(stream).received;
        let (posted, _) = Self::signals(stream);
        self.wait_for(predecessor, predecessor, posted, received.wrapping_add(1))?;
        Ok(self.transport.window(
            predecessor,
            Self::window_of(stream, received % self.slots(stream)),
        ))
    }

    /// Waits for the predecessor's next message on `stream` and returns it
    /// as `len` elements.
    fn receive<'a, T: Element>(
        &mut self,
        stream: Stream,
        len: usize,
    ) -> Result<&'a [T], EngineError> {
        let predecessor = self.predecessor();
        let window = self.next_from_predecessor(stream)?;
        if !self.predecessor_checked {
            self.check_stamp(predecessor, window)?;
            self.predecessor_checked = true;
        }
        // SAFETY: the predecessor posted this slot and will not write it again
        // until we `release` it; it outlives the call (the mapping lives as long
        // as the transport, which outlives every call).
        Ok(unsafe {
            std::slice::from_raw_parts(
                window.add(MESSAGE_HEADER_BYTES).cast::<T>().cast_const(),
                len,
            )
        })
    }

    /// Waits for the predecessor's first message of this call on `stream`,
    /// checks its stamp, and takes the chunk size written on it as this
    /// call's (a broadcast root's decision, passed down the chain).
    fn adopt_stamped_chunk(&mut self, stream: Stream) -> Result<u32, EngineError> {
        let predecessor = self.predecessor();
        let window = self.next_from_predecessor(stream)?;
        let chunk_bytes = self.check_stamp(predecessor, window)?.chunk_bytes;
        self.predecessor_checked = true;
        if let Some(call) = &mut self.current_call {
            call.chunk_bytes = chunk_bytes;
        }
        Ok(chunk_bytes)
    }

    fn release(&mut self, stream: Stream) {
        let counts = self.counts(stream);
        counts.received = counts.received.wrapping_add(1);
        let received = counts.received;
        let (_, consumed) = Self::signals(stream);
        self.transport.store(self.predecessor(), consumed, received);
    }

    /// Ring reduce-scatter and/or all-gather. Segment s of the buffer is
    /// reduced along the ring so that rank s ends up owning it (reduce-scatter:
    /// at step k rank r sends segment r−1−k), then each segment travels once
    /// more around the ring (all-gather: at step k rank r sends segment r−k).
    /// Chunks are pipelined with `in_flight` = L chunks of slack per step:
    /// message (step k, chunk c) is sent in iteration c + k·L and received in
    /// the successor's iteration c + (k+1)·L, so a rank that is briefly
    /// descheduled does not stall its neighbours until they run L chunks
    /// ahead of it at every step.
    fn run_ring<T: Element>(
        &mut self,
        call: CallDescriptor,
        ring: RingCall,
        mut buffers: Buffers<T>,
    ) -> Result<(), EngineError> {
        let (n, r) = (self.nranks, self.rank);
        let per_rank = match ring {
            RingCall::AllReduce(_) => buffers.input().len(),
            RingCall::ReduceScatter(_) => buffers.output().len(),
            RingCall::AllGather => buffers.input().len(),
        };
        if n == 1 {
            if let Buffers::OutOfPlace { input, output } = &mut buffers {
                output.copy_from_slice(input);
            }
            return Ok(());
        }
        // Segment s in the index space of the full N-segment buffer.
        let segment = |s: usize| match ring {
            RingCall::AllReduce(_) => part(per_rank, n, s),
            RingCall::ReduceScatter(_) | RingCall::AllGather => s * per_rank..(s + 1) * per_rank,
        };
        let steps = match ring {
            RingCall::AllReduce(_) => 2 * (n - 1),
            RingCall::ReduceScatter(_) | RingCall::AllGather => n - 1,
        };
        // The segment rank `rank` sends at step k.
        let sent_segment = |rank: usize, k: usize| -> usize {
            let back = match ring {
                RingCall::AllReduce(_) if k < n - 1 => 1 + k,
                RingCall::AllReduce(_) => k - (n - 1),
                RingCall::ReduceScatter(_) => 1 + k,
                RingCall::AllGather => k,
            };
            (rank + n * 2 - back % n) % n
        };
        // Where segment s of the full index space lives in this rank's input
        // and output (all_gather's input and reduce_scatter's output hold one
        // segment only).
        let input_range = |s: usize| match ring {
            RingCall::AllGather => 0..per_rank,
            _ => segment(s),
        };
        let output_range = |s: usize| match ring {
            RingCall::ReduceScatter(_) => 0..per_rank,
            _ => segment(s),
        };
        let op = match ring {
            RingCall::AllReduce(op) | RingCall::ReduceScatter(op) => Some(op),
            RingCall::AllGather => None,
        };
        if let (RingCall::AllGather, Buffers::OutOfPlace { input, output }) = (ring, &mut buffers) {
            output[segment(r)].copy_from_slice(input);
        }
        let chunk_elements = (call.chunk_bytes as usize / std::mem::size_of::<T>()).max(1);
        let longest = (0..n).map(|s| segment(s).len()).max().unwrap_or(0);
        let chunks = longest.div_ceil(chunk_elements).max(1);
        let lag = self.options.in_flight;
        let message_bytes = match ring {
            RingCall::AllReduce(_) => per_rank,
            RingCall::ReduceScatter(_) | RingCall::AllGather => per_rank * n,
        } * std::mem::size_of::<T>();
        let single_copy =
            self.single_copy && self.options.single_copy_messages.contains(&message_bytes);
        let mut addresses_sent = false;
        // The last reduce-scatter step, after which this rank owns a reduced segment.
        let last_reduce = match ring {
            RingCall::AllReduce(_) | RingCall::ReduceScatter(_) => Some(n - 2),
            RingCall::AllGather => None,
        };
        for iteration in 0..chunks + steps * lag {
            if iteration < chunks {
                let range = clip(&input_range(sent_segment(r, 0)), iteration, chunk_elements);
                let slot = self.send_slot::<T>(Stream::Raw, range.len())?;
                slot.copy_from_slice(&buffers.input()[range]);
                self.post(Stream::Raw);
            }
            for k in 0..steps {
                let Some(chunk) = iteration.checked_sub((k + 1) * lag) else {
                    break;
                };
                if chunk >= chunks {
                    continue;
                }
                let stream = if k == 0 { Stream::Raw } else { Stream::Relay };
                let s = sent_segment(self.predecessor(), k);
                let full = clip(&segment(s), chunk, chunk_elements);
                let len = full.len();
                let forward = k + 1 < steps;
                let reducing = last_reduce.is_some_and(|last| k <= last);
                // Single copy: a finished chunk (reduced, or gathered) is
                // forwarded as its address in the sender's output, which the
                // successor reads from there; partial sums still travel in
                // the relay slots.
                let finished_out =
                    single_copy && forward && last_reduce.is_none_or(|last| k >= last);
                let finished_in = single_copy && k >= 1 && last_reduce.is_none_or(|last| k > last);
                if finished_in {
                    let address = self.receive::<i64>(stream, 1)?[0] as u64;
                    let out_range = clip(&output_range(s), chunk, chunk_elements);
                    self.read_peer(
                        self.predecessor(),
                        address,
                        &mut buffers.output()[out_range.clone()],
                    )?;
                    if forward {
                        self.send_address(&buffers.output()[out_range])?;
                        self.post(Stream::Relay);
                        addresses_sent = true;
                    }
                    self.release(stream);
                    continue;
                }
                let incoming = self.receive::<T>(stream, len)?;
                if reducing && Some(k) != last_reduce {
                    let op = op.expect("reduce steps have an op");
                    let own = &buffers.input()[clip(&input_range(s), chunk, chunk_elements)];
                    let slot = self.send_slot::<T>(Stream::Relay, len)?;
                    combine(op, slot, incoming, Some(own));
                } else {
                    let out_range = clip(&output_range(s), chunk, chunk_elements);
                    if reducing {
                        let op = op.expect("reduce steps have an op");
                        let in_range = clip(&input_range(s), chunk, chunk_elements);
                        match &mut buffers {
                            Buffers::InPlace(buffer) => {
                                combine(op, &mut buffer[out_range.clone()], incoming, None)
                            }
                            Buffers::OutOfPlace { input, output } => combine(
                                op,
                                &mut output[out_range.clone()],
                                incoming,
                                Some(&input[in_range]),
                            ),
                        }
                        if op == ReduceOp::Avg {
                            finish_avg(&mut buffers.output()[out_range.clone()], n);
                        }
                    } else {
                        buffers.output()[out_range.clone()].copy_from_slice(incoming);
                    }
                    if finished_out {
                        self.send_address(&buffers.output()[out_range])?;
                        addresses_sent = true;
                    } else if forward {
                        let slot = self.send_slot::<T>(Stream::Relay, len)?;
                        slot.copy_from_slice(&buffers.output()[out_range]);
                    }
                }
                if forward {
                    self.post(Stream::Relay);
                }
                self.release(stream);
            }
        }
        if addresses_sent {
            // The successor reads from our output until it acknowledges the
            // last address we sent: only then may the caller have it back.
            let sent = self.relay.sent;
            self.wait_for(self.successor(), self.rank, Signal::RelayConsumed, sent)?;
        }
        if single_copy {
            // A predecessor that failed (and returned) before we read from
            // it recorded the failure first: what we read may be stale.
            if let Some(failure) = self.transport.failure() {
                return Err(failure.into());
            }
        }
        Ok(())
    }

    /// Every rank publishes its buffer (in windows of the one-shot size,
    /// alternating between two so a round never waits for peers to finish
    /// reading the previous one) and reduces all N in rank order, so every rank
    /// computes bit-identical results.
    fn run_one_shot<T: Element>(
        &mut self,
        call: CallDescriptor,
        op: ReduceOp,
        mut buffers: Buffers<T>,
    ) -> Result<(), EngineError> {
        let count = call.count as usize;
        let window_elements = (self.transport.sizes().one_shot_bytes - MESSAGE_HEADER_BYTES)
            / std::mem::size_of::<T>();
        let rounds = count.div_ceil(window_elements).max(1);
        for round in 0..rounds {
            let range = clip(&(0..count), round, window_elements);
            let parity = (self.one_shot_rounds % 2) as usize;
            let window = |owner: usize| self.transport.window(owner, Window::OneShot { parity });
            let mine = window(self.rank);
            self.stamp(mine);
            // SAFETY: our window of `one_shot_bytes`; every peer has finished
            // reading it two rounds ago (they posted the round after it, which
            // they only do once done), so only we touch it until we post.
            let data = unsafe {
                std::slice::from_raw_parts_mut(
                    mine.add(MESSAGE_HEADER_BYTES).cast::<T>(),
                    range.len(),
                )
            };
            data.copy_from_slice(&buffers.input()[range.clone()]);
            post_round(&*self.transport, self.rank, &mut self.one_shot_rounds);
            for peer in (0..self.nranks).filter(|peer| *peer != self.rank) {
                self.wait_for(peer, peer, Signal::OneShotPosted, self.one_shot_rounds)?;
                if round == 0 {
                    self.check_stamp(peer, window(peer))?;
                }
            }
            let data_of = |owner: usize| -> &[T] {
                // SAFETY: each owner posted this round; nobody writes its
                // window again until every rank has posted the next round.
                unsafe {
                    std::slice::from_raw_parts(
                        window(owner)
                            .add(MESSAGE_HEADER_BYTES)
                            .cast::<T>()
                            .cast_const(),
                        range.len(),
                    )
                }
            };
            let output = &mut buffers.output()[range.clone()];
            combine(op, output, data_of(1), Some(data_of(0)));
            for owner in 2..self.nranks {
                combine(op, output, data_of(owner), None);
            }
            if op == ReduceOp::Avg {
                finish_avg(output, self.nranks);
            }
        }
        Ok(())
    }

    /// Direct all_reduce: rank r owns segment r. It reads that segment from
    /// every peer's input in pieces and reduces each piece into its own
    /// output (reduce-scatter), then reads every other segment straight from
    /// its owner's output (all-gather). Each element is reduced by one rank,
    /// so all ranks hold bit-identical results. Ranks only ever read each
    /// other's memory: a rank that fails mid-call cannot leave a peer writing
    /// into buffers it has already handed back.
    ///
    /// Three rounds on the one-shot counter: the buffers' addresses (in the
    /// one-shot window, stamped with the call); the segment reduced (its
    /// owner is done reading the peers' inputs, so in place each peer may now
    /// overwrite its own copy of that segment); done. A rank returns once
    /// every peer is done, since until then peers may still read its buffers.
    ///
    /// The all-gather reads whole segments after the reduce-scatter rather
    /// than piece by piece behind it: a piece just reduced sits modified in
    /// its owner's cache, and copying it from there to another core measured
    /// a third slower than from the shared cache once the segment is done.
    fn run_direct<T: Element>(
        &mut self,
        call: CallDescriptor,
        op: ReduceOp,
        mut buffers: Buffers<T>,
    ) -> Result<(), EngineError> {
        let (n, r) = (self.nranks, self.rank);
        let parity = (self.one_shot_rounds % 2) as usize;
        let windows: Vec<*mut u8> = (0..n)
            .map(|owner| self.transport.window(owner, Window::OneShot { parity }))
            .collect();
        self.stamp(windows[r]);
        let addresses = [
            buffers.input().as_ptr() as u64,
            buffers.output().as_mut_ptr() as u64,
        ];
        // SAFETY: our one-shot window, past its stamp; every peer read what we
        // last published there before posting the round after it, which we
        // waited for, so only we touch it until we post.
        unsafe {
            std::ptr::copy_nonoverlapping(
                addresses.as_ptr(),
                windows[r].add(MESSAGE_HEADER_BYTES).cast::<u64>(),
                addresses.len(),
            )
        };
        let peers = move || (0..n).filter(move |peer| *peer != r);
        post_round(&*self.transport, r, &mut self.one_shot_rounds);
        let mut peer_buffers = vec![[0u64; 2]; n];
        for peer in peers() {
            self.wait_for(peer, peer, Signal::OneShotPosted, self.one_shot_rounds)?;
            self.check_stamp(peer, windows[peer])?;
            // SAFETY: the peer posted this window and leaves it alone until
            // we post our next round.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    windows[peer]
                        .add(MESSAGE_HEADER_BYTES)
                        .cast::<u64>()
                        .cast_const(),
                    peer_buffers[peer].as_mut_ptr(),
                    2,
                )
            };
        }
        let [input_at, output_at] = [0, 1];
        let element = std::mem::size_of::<T>();
        let count = call.count as usize;

        let mut scratch = std::mem::take(&mut self.direct_scratch);
        scratch.resize(DIRECT_PIECE_BYTES / 8, 0);
        let piece = DIRECT_PIECE_BYTES / element;
        // SAFETY: the scratch is 8-byte aligned, every `Element` is at most 8
        // bytes and plain numbers (any bit pattern is one), and it holds
        // `piece` of them.
        let incoming =
            unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<T>(), piece) };
        let segment = part(count, n, r);
        let mut reduce = || -> Result<(), EngineError> {
            for index in 0..segment.len().div_ceil(piece) {
                let range = clip(&segment, index, piece);
                let offset = (range.start * element) as u64;
                let incoming = &mut incoming[..range.len()];
                for (position, peer) in peers().enumerate() {
                    self.read_peer(peer, peer_buffers[peer][input_at] + offset, incoming)?;
                    match (&mut buffers, position) {
                        (Buffers::OutOfPlace { input, output }, 0) => combine(
                            op,
                            &mut output[range.clone()],
                            incoming,
                            Some(&input[range.clone()]),
                        ),
                        _ => combine(op, &mut buffers.output()[range.clone()], incoming, None),
                    }
                }
                if op == ReduceOp::Avg {
                    finish_avg(&mut buffers.output()[range], n);
                }
            }
            Ok(())
        };
        let reduced = reduce();
        self.direct_scratch = scratch;
        reduced?;

        post_round(&*self.transport, r, &mut self.one_shot_rounds);
        for peer in peers() {
            self.wait_for(peer, peer, Signal::OneShotPosted, self.one_shot_rounds)?;
            let range = part(count, n, peer);
            let offset = (range.start * element) as u64;
            self.read_peer(
                peer,
                peer_buffers[peer][output_at] + offset,
                &mut buffers.output()[range],
            )?;
        }
        post_round(&*self.transport, r, &mut self.one_shot_rounds);
        for peer in peers() {
            self.wait_for(peer, peer, Signal::OneShotPosted, self.one_shot_rounds)?;
        }
        // A peer that failed (and returned) before we read its segment
        // recorded the failure first: what we read may be stale.
        if let Some(failure) = self.transport.failure() {
            return Err(failure.into());
        }
        Ok(())
    }

    /// A pipelined chain root → root+1 → … → root−1 on the raw stream.
    fn run_broadcast<T: Element>(
        &mut self,
        call: CallDescriptor,
        buffer: &mut [T],
        root: usize,
    ) -> Result<(), EngineError> {
        let position = (self.rank + self.nranks - root) % self.nranks;
        let chunk_bytes = if position == 0 {
            call.chunk_bytes
        } else {
            self.adopt_stamped_chunk(Stream::Raw)?
        };
        let chunk_elements = (chunk_bytes as usize / std::mem::size_of::<T>()).max(1);
        let chunks = buffer.len().div_ceil(chunk_elements).max(1);
        for chunk in 0..chunks {
            let range = clip(&(0..buffer.len()), chunk, chunk_elements);
            if position == 0 {
                let slot = self.send_slot::<T>(Stream::Raw, range.len())?;
                slot.copy_from_slice(&buffer[range]);
                self.post(Stream::Raw);
                continue;
            }
            let incoming = self.receive::<T>(Stream::Raw, range.len())?;
            buffer[range.clone()].copy_from_slice(incoming);
            if position + 1 < self.nranks {
                let slot = self.send_slot::<T>(Stream::Raw, range.len())?;
                slot.copy_from_slice(incoming);
                self.post(Stream::Raw);
            }
            self.release(Stream::Raw);
        }
        Ok(())
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.transport.set_departed();
    }
}
