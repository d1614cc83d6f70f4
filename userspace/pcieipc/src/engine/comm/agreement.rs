//! How ranks agree on each call: every rank publishes its descriptor before
//! the call moves data, one rank decides the chunk size and the others adopt
//! it, and a peer whose call differs (or whose stamp on a message does) is
//! reported with both calls.

use super::slots::MESSAGE_HEADER_BYTES;
use super::Communicator;
use crate::engine::call::{CallDescriptor, CallKind};
use crate::engine::dtype::{DType, ReduceOp};
use crate::engine::error::EngineError;
use crate::engine::failure::{Corruption, Failure};
use crate::engine::fault_monitor::CallPosition;
use crate::engine::schedule::Algorithm;
use crate::engine::slot_fill::{CallClass, SlotFill};
use crate::engine::transport::Signal;
use crate::trace::{monotonic_ns, Arg};

impl Communicator {
    /// Starts call number `self.calls`: refuses if the communicator has failed,
    /// settles the chunk size, and publishes the call for the peers to check.
    ///
    /// One rank decides each call's chunk, the smallest that any rank's
    /// published link asks for: rank 0 for the ring calls, whose descriptor
    /// the others wait for and adopt (rank 0 cannot finish a ring call before
    /// every rank has begun it, so its descriptor is still there), and the root
    /// for a broadcast, whose chunk reaches the others on its messages' stamps
    /// (a root can run calls ahead of the chain).
    pub(crate) fn begin(
        &mut self,
        kind: CallKind,
        dtype: DType,
        op: Option<ReduceOp>,
        count: usize,
        root: usize,
        algorithm: Algorithm,
    ) -> Result<CallDescriptor, EngineError> {
        if let Some(trace) = &self.trace {
            trace.begin_call();
        }
        if let Some(failure) = self.transport.failure() {
            return Err(failure.into());
        }
        self.follow_link_events()?;
        let mut call = CallDescriptor {
            kind,
            dtype,
            op,
            count: count as u64,
            root: root as u32,
            algorithm,
            chunk_bytes: 0,
            bypass_slots: false,
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
                if kind != CallKind::Broadcast {
                    call.bypass_slots = self.decide_fill(kind, message_bytes);
                }
            } else if kind != CallKind::Broadcast {
                (call.chunk_bytes, call.bypass_slots) = self.adopt_decision(call, message_bytes)?;
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

    pub(crate) fn end(&mut self, result: Result<(), EngineError>) -> Result<(), EngineError> {
        let fill = self.current_fill.take();
        let measured = self.measured_call.take();
        if let (Some(chooser), Some((class, started)), Ok(())) =
            (&mut self.fill_chooser, measured, &result)
        {
            // A call whose working set took the raw slots past the cache
            // whatever was chosen says nothing about the choice.
            if fill != Some(SlotFill::RawBypass) {
                chooser.record(class, monotonic_ns().saturating_sub(started));
            }
        }
        if let (Some(trace), Some(call)) = (&self.trace, &self.current_call) {
            // The peers this call woke, at the times the stores woke them.
            for at in self.transport.take_wakes() {
                trace.instant(self.transport.wake_name(), "wake", at, Vec::new());
            }
            let mut args = vec![
                ("call", Arg::Int(self.calls as i64)),
                ("dtype", Arg::Text(call.dtype.name())),
                ("count", Arg::Int(call.count as i64)),
                ("algorithm", Arg::Text(call.algorithm.name())),
                ("chunk_bytes", Arg::Int(i64::from(call.chunk_bytes))),
                ("ok", Arg::Int(i64::from(result.is_ok()))),
            ];
            if let Some(fill) = fill {
                args.push(("slot_fill", Arg::Text(fill.name())));
            }
            trace.end_call(call.kind.name(), args);
        }
        // With checksums, what this rank sent may be asked for again until
        // its successor has consumed it.
        let result = result.and_then(|()| self.drain_streams());
        // Where the data lives in a device's memory, a call that read
        // through a window of a device that went away meanwhile read the
        // module's stand-in page, not the data: the module queues
        // DEVICE_GONE before that page can appear, so a call that ends
        // without the event in the stream read the device.
        let result = result.and_then(|()| {
            if self.transport.capabilities().device_memory {
                self.poll_link_events()
            } else {
                Ok(())
            }
        });
        self.calls += 1;
        self.last_call = self.current_call.take();
        result
    }

    /// The current call, as this rank made it.
    pub(crate) fn current_call(&self) -> CallDescriptor {
        self.current_call.expect("only asked inside a call")
    }

    /// Takes the chunk size a broadcast root decided (read from the stamp
    /// on its first message) as this call's.
    pub(crate) fn adopt_chunk_bytes(&mut self, chunk_bytes: u32) {
        if let Some(call) = &mut self.current_call {
            call.chunk_bytes = chunk_bytes;
        }
    }

    /// Polls the fault monitor where it is due (at each call's start, at
    /// each step that sends a chunk, at each sleep slice of a wait): the
    /// device link's changes, and the action the AER matrix gives each
    /// fault (`fault_monitor`).
    pub(crate) fn follow_link_events(&mut self) -> Result<(), EngineError> {
        if !self.monitor.due() {
            return Ok(());
        }
        self.poll_link_events()
    }

    /// Records `failure`, which blames a peer (for what this rank read of
    /// the peer's shared memory, or for dying, leaving or stalling), unless
    /// a device of the job reports a fault: reads through a device in error
    /// (its reset in progress reads zeros) are no evidence against a peer,
    /// a peer whose device was removed fails or stalls for that, and the
    /// device's fault is the failure then.
    pub(crate) fn blame_peer(&mut self, failure: Failure) -> EngineError {
        match self.poll_link_events() {
            Err(fault) => fault,
            Ok(()) => self.transport.abort(failure).into(),
        }
    }

    /// `follow_link_events` whether or not it is due.
    fn poll_link_events(&mut self) -> Result<(), EngineError> {
        let at = CallPosition {
            call: self.calls,
            in_call: self.current_call.is_some(),
        };
        let published = self
            .monitor
            .poll(&mut *self.transport, at, self.trace.as_ref())?;
        if published.is_some() {
            self.options.link = published;
        }
        Ok(())
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

    /// Whether a ring call of `kind` and `message_bytes` fills its slots
    /// past the cache (below the streaming threshold): what this rank's
    /// measurements keep, or the probe they are due (`slot_fill`). The
    /// call's time reaches them in `end`.
    fn decide_fill(&mut self, kind: CallKind, message_bytes: usize) -> bool {
        let Some(chooser) = &self.fill_chooser else {
            return false;
        };
        let class = CallClass::new(kind, message_bytes);
        self.measured_call = Some((class, monotonic_ns()));
        chooser.choose(class) == SlotFill::Bypass
    }

    /// Waits for rank 0 to publish this call and returns the chunk size and
    /// slot fill it decided; a different call there is a mismatch.
    fn adopt_decision(
        &mut self,
        call: CallDescriptor,
        message_bytes: usize,
    ) -> Result<(u32, bool), EngineError> {
        self.wait_for(0, 0, Signal::CallsPublished, (self.calls + 1) as u32)?;
        match self.transport.published_call(0, self.calls) {
            Some(decided) if decided.same_call(&call) => Ok((
                self.check_chunk(0, decided.chunk_bytes)?,
                decided.bypass_slots,
            )),
            Some(peer_call) => Err(self.abort_mismatch(call, 0, peer_call)),
            // Rank 0 already runs a later call, which only a call that needs
            // nothing from this rank lets it do (a broadcast from rank 0): the
            // calls differ, which the stamp on the first message received
            // reports. Until then any chunk and fill do.
            None => Ok((
                self.decide_chunk(message_bytes, call.dtype.size_bytes()),
                false,
            )),
        }
    }

    /// `chunk_bytes` as `peer` decided it, if a slot holds such a chunk;
    /// otherwise the peer's shared memory was written by no honest rank.
    pub(crate) fn check_chunk(
        &mut self,
        peer: usize,
        chunk_bytes: u32,
    ) -> Result<u32, EngineError> {
        let capacity = self.transport.sizes().slot_bytes - MESSAGE_HEADER_BYTES;
        if chunk_bytes != 0 && chunk_bytes as usize <= capacity {
            return Ok(chunk_bytes);
        }
        Err(self.blame_peer(Failure::PeerCorrupt {
            rank: self.rank,
            peer,
            what: Corruption::ChunkSize,
        }))
    }

    /// Compares `peer`'s published descriptor of the current call with ours.
    pub(crate) fn check_call(&mut self, peer: usize) -> Result<(), EngineError> {
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

    /// Checks the stamp `peer` wrote on a message it published (`stamp`:
    /// its call number and descriptor words) against our call, and returns
    /// the peer's call (with the chunk size it moves in). The stamp travels
    /// with the data, so this holds however many calls ahead the peer has
    /// run (a broadcast chain lets it run ahead).
    pub(crate) fn check_stamp(
        &mut self,
        peer: usize,
        stamp: [u64; 4],
    ) -> Result<CallDescriptor, EngineError> {
        let call = self.current_call();
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

    /// The stamp of the current call, as messages carry it.
    pub(crate) fn stamp(&self) -> [u64; 4] {
        let [head, count, chunk_bytes] = self.current_call().to_words();
        [self.calls, head, count, chunk_bytes]
    }

    /// Records that `peer` made `peer_call` where this rank made `call`, and
    /// returns the failure that stands (another may have been recorded first).
    fn abort_mismatch(
        &mut self,
        call: CallDescriptor,
        peer: usize,
        peer_call: CallDescriptor,
    ) -> EngineError {
        self.blame_peer(Failure::MismatchedCall {
            rank: self.rank,
            call,
            peer,
            peer_call,
        })
    }
}
