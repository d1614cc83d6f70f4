//! The communicator: N ranks in separate processes, their public collectives,
//! and what every collective relies on: joining (`init`), agreeing on each
//! call and catching mismatches (`agreement`), waiting on peers while
//! watching their liveness (`wait`), the slots ranks hand each other
//! (`slots`, the one place here that touches shared memory by pointer), and
//! reading peers' memory where the transport allows it (`peer_reads`). It
//! sees its transport only through the `Transport` trait and its declared
//! capabilities; the algorithms live in `collectives`.

mod agreement;
mod checksums;
mod init;
mod options;
mod peer_reads;
mod slots;
mod wait;

use std::time::Duration;

pub use checksums::{DamageInjection, ResendRecord};
pub use options::CommOptions;
pub(crate) use slots::{Stream, MESSAGE_HEADER_BYTES};

use super::call::{CallDescriptor, CallKind};
use super::collectives::{Buffers, RingCall};
use super::dtype::{Element, ReduceOp};
use super::error::EngineError;
use super::schedule::{self, Algorithm, AlgorithmChoice, Limits};
use super::transport::Transport;
use crate::trace::Recorder;

/// A rank's counts of the messages it sent and received on one stream, and
/// which of the stream's slots they cycle through: the first `in_use`,
/// counted from the message numbers at which that count took effect.
pub(crate) struct StreamCounts {
    pub(crate) sent: u32,
    pub(crate) received: u32,
    pub(crate) sent_base: u32,
    pub(crate) received_base: u32,
    pub(crate) in_use: u32,
}

impl StreamCounts {
    /// A stream of `slots` slots, all in use.
    pub(crate) fn new(slots: usize) -> StreamCounts {
        StreamCounts {
            sent: 0,
            received: 0,
            sent_base: 0,
            received_base: 0,
            in_use: slots as u32,
        }
    }
}

pub struct Communicator {
    pub(crate) transport: Box<dyn Transport>,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) options: CommOptions,
    /// The devices the job depends on, and the faults acted on.
    monitor: super::fault_monitor::FaultMonitor,
    /// Calls started so far; the current call's number while one runs.
    pub(crate) calls: u64,
    raw: StreamCounts,
    pub(crate) relay: StreamCounts,
    /// Rounds posted on this rank's one-shot counter: one-shot windows, and
    /// the direct algorithm's three meetings per call.
    pub(crate) one_shot_rounds: u32,
    /// Where the direct algorithm lands each piece it reads from a peer,
    /// kept between calls.
    pub(crate) direct_scratch: Vec<u64>,
    /// Whether the stamp on this call's first message from the predecessor
    /// has been checked against our call.
    predecessor_checked: bool,
    current_call: Option<CallDescriptor>,
    last_call: Option<CallDescriptor>,
    /// This rank's timeline, when tracing.
    pub(crate) trace: Option<Recorder>,
    init_time: Duration,
    /// Whether ranks read finished data straight from each other's buffers
    /// (the ring's all-gather for messages in `options.single_copy_messages`,
    /// and the direct algorithm): agreed by all ranks at init.
    pub(crate) single_copy: bool,
    /// The working set in bytes from which the ring's raw slots are filled
    /// with non-temporal stores (`usize::MAX`: never), resolved at init from
    /// `options.streaming_stores`.
    pub(crate) streaming_from: usize,
    /// Below `streaming_from`, the measured choice between plain and
    /// non-temporal slot fills (`slot_fill`), where the streaming stores
    /// are `Auto` on host memory; `None`: plain.
    pub(crate) fill_chooser: Option<crate::engine::slot_fill::FillChooser>,
    /// How the current ring call fills its slots, for its trace.
    pub(crate) current_fill: Option<crate::engine::slot_fill::SlotFill>,
    /// The class of the current call and when it began, where this rank
    /// chose its slot fill: its time goes to `fill_chooser` at its end.
    measured_call: Option<(crate::engine::slot_fill::CallClass, u64)>,
    /// Whether `init` is still agreeing with the peers: waits then last up
    /// to `join_timeout`, not `peer_timeout`.
    pub(crate) joining: bool,
    /// This rank's side of chunk checksums, where they are on.
    checksums: Option<checksums::Checksums>,
}

impl Communicator {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Every rank's pid (the kernel's, from the rendezvous): what a
    /// backend's own liveness watch needs.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.transport.pids()
    }

    /// `owner`'s backend area as mapped in this process and its length
    /// (`CommOptions::backend_bytes`, rank 0's, page aligned), `None` when
    /// the segment has none. The engine never reads or writes it; it lives
    /// as long as the communicator.
    pub(crate) fn backend_area(&self, owner: usize) -> Option<(std::ptr::NonNull<u8>, usize)> {
        let bytes = self.transport.sizes().backend_bytes;
        if bytes == 0 || owner >= self.nranks {
            return None;
        }
        let start = self
            .transport
            .window(owner, super::transport::Window::Backend);
        std::ptr::NonNull::new(start).map(|start| (start, bytes))
    }

    /// How long `init` took, rendezvous and transport set-up included.
    pub fn init_time(&self) -> Duration {
        self.init_time
    }

    /// The name of the transport the ranks meet over.
    pub fn transport_name(&self) -> &'static str {
        self.transport.name()
    }

    /// What the transport can do beyond windows and counters.
    pub fn transport_capabilities(&self) -> super::transport::Capabilities {
        self.transport.capabilities()
    }

    /// Whether the ring's all-gather copies once (for messages in
    /// `CommOptions::single_copy_messages`), each rank reading finished
    /// chunks straight from its predecessor's output (a transport with peer
    /// reads, where every rank could read its predecessor's memory at init),
    /// or twice, through the relay slots. Every rank of a communicator
    /// reports the same.
    pub fn single_copy(&self) -> bool {
        self.single_copy
    }

    /// The working set in bytes (every rank's input, and output when out of
    /// place, together) from which this rank's ring fills its raw slots with
    /// non-temporal stores; `None`: never (`CommOptions::streaming_stores`).
    pub fn streaming_stores_from(&self) -> Option<usize> {
        (self.streaming_from != usize::MAX).then_some(self.streaming_from)
    }

    /// Whether, below `streaming_stores_from`, ring calls choose between
    /// plain and non-temporal slot fills by measuring (`slot_fill`), rather
    /// than always filling with plain stores.
    pub fn slot_fill_measured(&self) -> bool {
        self.fill_chooser.is_some()
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
        self.monitor.faults()
    }

    /// Whether this rank's messages carry checksums, checked on receipt.
    pub fn chunk_checksums(&self) -> bool {
        self.checksums.is_some()
    }

    /// The messages that arrived damaged and were read again until whole,
    /// oldest first, each with the stall it cost.
    pub fn resends(&self) -> &[ResendRecord] {
        self.checksums
            .as_ref()
            .map_or(&[], |checksums| checksums.resends())
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
    pub fn set_link(&mut self, link: Option<super::LinkFacts>) {
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
        let limits = Limits {
            one_shot_read_budget: self.options.one_shot_read_budget,
            one_shot_max_ranks: usize::MAX,
            direct_messages: self
                .single_copy
                .then(|| self.options.direct_messages.clone()),
        };
        schedule::select(
            self.options.algorithm,
            count * std::mem::size_of::<T>(),
            self.nranks,
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
                reason: "ranks may not read each other's memory (a transport with peer \
                         reads, allowed between all ranks, and single-copy on)",
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
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.transport.set_departed();
        if let Some(trace) = &self.trace {
            // Drop cannot return it: a trace asked for and not written is said.
            if let Err(error) = trace.write() {
                eprintln!("pcieipc: rank {}: writing its trace: {error}", self.rank);
            }
        }
    }
}
