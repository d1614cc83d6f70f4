//! The communicator: N ranks in separate processes and their public
//! collectives, a thin façade over the types that do the work:
//!
//! - `Peers` (`peers`): waiting on peers, bounded, with every failure
//!   named; it owns the transport, the call `Agreement` (`agreement`), the
//!   fault monitor, the resend `Shadows` (`shadows`) and the trace.
//! - `SlotStreams` (`streams`): the slots and one-shot windows ranks hand
//!   each other (`message`: what a message looks like), with the checked
//!   copies of what they read (`checked`).
//! - the host algorithms, functions over those two (`collectives`).
//!
//! It names no transport: what one can do reaches it as the `Transport`'s
//! declared capabilities.

mod agreement;
mod checked;
mod init;
pub(crate) mod message;
mod options;
mod peer_reads;
pub(crate) mod peers;
mod shadows;
pub(crate) mod streams;

use std::time::Duration;

pub use checked::ResendRecord;
pub use options::CommOptions;
pub use shadows::DamageInjection;

use super::call::{CallDescriptor, CallKind};
use super::collectives::{self, Buffers, RingCall, RingSettings};
use super::dtype::{Element, ReduceOp};
use super::error::EngineError;
use super::schedule::{self, Algorithm, AlgorithmChoice, Limits};
use super::slot_fill::SlotFill;
use agreement::Agreement;
use peers::Peers;
use streams::SlotStreams;

pub struct Communicator {
    peers: Peers,
    streams: SlotStreams,
    options: CommOptions,
    /// What the ring's steps depend on, agreed at init: whether ranks read
    /// finished data straight from each other's buffers (the ring's
    /// all-gather for messages in `options.single_copy_messages`, and the
    /// direct algorithm), and from which working set its raw slots are
    /// filled with non-temporal stores.
    ring: RingSettings,
    /// Where the direct algorithm lands each piece it reads from a peer,
    /// kept between calls.
    direct_scratch: Vec<u64>,
    init_time: Duration,
}

impl Communicator {
    pub fn rank(&self) -> usize {
        self.peers.rank
    }

    pub fn nranks(&self) -> usize {
        self.peers.nranks
    }

    /// Every rank's pid (the kernel's, from the rendezvous): what a
    /// backend's own liveness watch needs.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.peers.transport.pids()
    }

    /// `owner`'s backend area as mapped in this process and its length
    /// (`CommOptions::backend_bytes`, rank 0's, page aligned), `None` when
    /// the segment has none. The engine never reads or writes it; it lives
    /// as long as the communicator.
    pub(crate) fn backend_area(&self, owner: usize) -> Option<(std::ptr::NonNull<u8>, usize)> {
        let transport = &self.peers.transport;
        let bytes = transport.sizes().backend_bytes;
        if bytes == 0 || owner >= self.peers.nranks {
            return None;
        }
        let start = transport.window(owner, super::transport::Window::Backend);
        std::ptr::NonNull::new(start).map(|start| (start, bytes))
    }

    /// This rank's timeline, when tracing: a backend's own spans go there.
    pub(crate) fn trace(&self) -> Option<&crate::trace::Recorder> {
        self.peers.trace.as_ref()
    }

    /// Acts on the faults of the devices the job depends on, where a poll
    /// is due: a backend's own steps are step boundaries too.
    pub(crate) fn follow_faults(&mut self) -> Result<(), EngineError> {
        self.peers.follow_faults()
    }

    /// How long `init` took, rendezvous and transport set-up included.
    pub fn init_time(&self) -> Duration {
        self.init_time
    }

    /// The name of the transport the ranks meet over.
    pub fn transport_name(&self) -> &'static str {
        self.peers.transport.kind().name
    }

    /// What the transport can do beyond windows and counters.
    pub fn transport_capabilities(&self) -> super::transport::Capabilities {
        self.peers.transport.capabilities()
    }

    /// Whether the ring's all-gather copies once (for messages in
    /// `CommOptions::single_copy_messages`), each rank reading finished
    /// chunks straight from its predecessor's output (a transport with peer
    /// reads, where every rank could read its predecessor's memory at init),
    /// or twice, through the relay slots. Every rank of a communicator
    /// reports the same.
    pub fn single_copy(&self) -> bool {
        self.ring.single_copy_messages.is_some()
    }

    /// The working set in bytes (every rank's input, and output when out of
    /// place, together) from which this rank's ring fills its raw slots with
    /// non-temporal stores; `None`: never (`CommOptions::streaming_stores`).
    pub fn streaming_stores_from(&self) -> Option<usize> {
        let from = self.ring.streaming_from;
        (from != usize::MAX).then_some(from)
    }

    /// Whether, below `streaming_stores_from`, ring calls choose between
    /// plain and non-temporal slot fills by measuring (`slot_fill`), rather
    /// than always filling with plain stores.
    pub fn slot_fill_measured(&self) -> bool {
        self.peers.agreement.fill_measured()
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

    /// The faults on this rank's device link it acted on (the AER matrix of
    /// docs/fault-path.md), oldest first, each with the stall it cost.
    pub fn faults(&self) -> &[super::fault_policy::FaultRecord] {
        self.peers.faults()
    }

    /// Whether this rank's messages carry checksums, checked on receipt.
    pub fn chunk_checksums(&self) -> bool {
        self.peers.shadows.is_some()
    }

    /// The messages that arrived damaged and were read again until whole,
    /// oldest first, each with the stall it cost.
    pub fn resends(&self) -> &[ResendRecord] {
        self.streams.resends()
    }

    /// The last call this rank made, with the chunk size it moved in.
    pub fn last_call(&self) -> Option<CallDescriptor> {
        self.peers.agreement.last()
    }

    /// Publishes a changed link (after a link or AER event) for the chunk
    /// sizes of the next calls. Any rank may call it between any two of its
    /// calls, alone: each call's chunk is decided by one rank from every
    /// rank's published link and adopted by the others, so a change takes
    /// effect at the same call on every rank (the next call that rank decides).
    pub fn set_link(&mut self, link: Option<super::LinkFacts>) {
        self.options.link = link;
        self.peers.transport.publish_link(link);
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
        let limits = Limits {
            one_shot_read_budget: self.options.one_shot_read_budget,
            one_shot_max_ranks: usize::MAX,
            direct_messages: self
                .single_copy()
                .then(|| self.options.direct_messages.clone()),
        };
        schedule::select(
            self.options.algorithm,
            count * std::mem::size_of::<T>(),
            self.peers.nranks,
            &limits,
        )
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
            output.len() * self.peers.nranks,
        )?;
        let call = self.begin(
            Agreement::describe(
                CallKind::ReduceScatter,
                T::DTYPE,
                Some(op),
                output.len(),
                0,
                Algorithm::Ring,
            ),
            false,
        )?;
        let result = self.ring(
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
            input.len() * self.peers.nranks,
        )?;
        let call = self.begin(
            Agreement::describe(
                CallKind::AllGather,
                T::DTYPE,
                None,
                input.len(),
                0,
                Algorithm::Ring,
            ),
            false,
        )?;
        let result = self.ring(
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
        let nranks = self.peers.nranks;
        if root >= nranks {
            return Err(EngineError::RootOutOfRange { root, nranks });
        }
        let call = self.begin(
            Agreement::describe(
                CallKind::Broadcast,
                T::DTYPE,
                None,
                buffer.len(),
                root,
                Algorithm::Ring,
            ),
            true,
        )?;
        let result = if nranks == 1 {
            Ok(None)
        } else {
            collectives::broadcast(&mut self.peers, &mut self.streams, call, buffer, root)
                .map(|()| None)
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
        if algorithm == Algorithm::Direct && !self.single_copy() {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm,
                reason: "ranks may not read each other's memory (a transport with peer \
                         reads, allowed between all ranks, and single-copy on)",
            });
        }
        let in_place = matches!(buffers, Buffers::InPlace(_));
        let call = self.begin(
            Agreement::describe(CallKind::AllReduce, T::DTYPE, Some(op), count, 0, algorithm),
            in_place,
        )?;
        let result = if self.peers.nranks == 1 {
            if let Buffers::OutOfPlace { input, output } = &mut buffers {
                output.copy_from_slice(input);
            }
            Ok(None)
        } else {
            let (peers, streams) = (&mut self.peers, &mut self.streams);
            match algorithm {
                Algorithm::Ring => self.ring(call, RingCall::AllReduce(op), buffers),
                Algorithm::OneShot => {
                    collectives::one_shot(peers, streams, call, op, buffers).map(|()| None)
                }
                Algorithm::Direct => {
                    let scratch = &mut self.direct_scratch;
                    collectives::direct(peers, streams, scratch, call, op, buffers).map(|()| None)
                }
            }
        };
        self.end(result)
    }

    /// A ring call, returning how it filled its slots.
    fn ring<T: Element>(
        &mut self,
        call: CallDescriptor,
        ring_call: RingCall,
        buffers: Buffers<T>,
    ) -> Result<Option<SlotFill>, EngineError> {
        let (peers, streams) = (&mut self.peers, &mut self.streams);
        collectives::ring(peers, streams, &self.ring, call, ring_call, buffers).map(Some)
    }

    /// Starts call `call` (its decisions still open; `in_place`: whether
    /// this rank's output is its input) on every part.
    fn begin(
        &mut self,
        call: CallDescriptor,
        in_place: bool,
    ) -> Result<CallDescriptor, EngineError> {
        let call = self.peers.begin_call(call, in_place)?;
        self.streams.begin_call();
        Ok(call)
    }

    /// Ends the current call, which returned `result` (with how it filled
    /// its slots, for a ring call).
    fn end(&mut self, result: Result<Option<SlotFill>, EngineError>) -> Result<(), EngineError> {
        let fill = result.as_ref().ok().copied().flatten();
        // With checksums, what this rank sent may be asked for again until
        // its successor has consumed it.
        let result = result.and_then(|_| self.streams.drain(&mut self.peers));
        self.peers.end_call(result, fill)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.peers.transport.set_departed();
        if let Some(trace) = &self.peers.trace {
            // Drop cannot return it: a trace asked for and not written is said.
            if let Err(error) = trace.write() {
                eprintln!(
                    "pcieipc: rank {}: writing its trace: {error}",
                    self.peers.rank
                );
            }
        }
    }
}
