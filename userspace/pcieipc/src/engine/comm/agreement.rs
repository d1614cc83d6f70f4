//! How ranks agree on each call: every rank publishes its descriptor before
//! the call moves data, one rank decides the chunk size and slot fill and the
//! others adopt them, and a peer whose call differs (or whose stamp on a
//! message does) is found here, with both calls. `Agreement` keeps this
//! rank's side (the call number, the current and last calls, the decisions'
//! inputs); it reads the peers' published calls but never waits or fails
//! the job: `Peers` does both.

use super::message::MESSAGE_HEADER_BYTES;
use crate::engine::call::{CallDescriptor, CallKind};
use crate::engine::chunk::ChunkPolicy;
use crate::engine::dtype::{DType, ReduceOp};
use crate::engine::schedule::Algorithm;
use crate::engine::slot_fill::{CallClass, FillChooser, SlotFill};
use crate::engine::transport::Transport;
use crate::trace::monotonic_ns;

/// What rank 0 published for the call this rank is beginning.
pub(crate) enum Published {
    /// The same call, with the chunk size and slot fill rank 0 decided.
    Decided {
        chunk_bytes: u32,
        bypass_slots: bool,
    },
    /// Another call: the job's calls diverged.
    Differs(CallDescriptor),
    /// Rank 0 already runs a later call, which only a call that needs nothing
    /// from this rank lets it do (a broadcast from rank 0): the calls differ,
    /// which the stamp on the first message received reports.
    Overtaken,
}

pub(crate) struct Agreement {
    rank: usize,
    nranks: usize,
    chunk_policy: ChunkPolicy,
    /// Calls started so far; the current call's number while one runs.
    calls: u64,
    current: Option<CallDescriptor>,
    last: Option<CallDescriptor>,
    /// Below the streaming threshold, the measured choice between plain and
    /// non-temporal slot fills (`slot_fill`), where streaming stores are
    /// `Auto` on host memory; `None`: plain.
    fill_chooser: Option<FillChooser>,
    /// The class of the current call and when it began, where this rank
    /// chose its slot fill: its time goes to `fill_chooser` at its end.
    measured: Option<(CallClass, u64)>,
}

impl Agreement {
    pub(crate) fn new(
        rank: usize,
        nranks: usize,
        chunk_policy: ChunkPolicy,
        fill_chooser: Option<FillChooser>,
    ) -> Agreement {
        Agreement {
            rank,
            nranks,
            chunk_policy,
            calls: 0,
            current: None,
            last: None,
            fill_chooser,
            measured: None,
        }
    }

    /// The current call's number, or the next one's between calls.
    pub(crate) fn calls(&self) -> u64 {
        self.calls
    }

    pub(crate) fn in_call(&self) -> bool {
        self.current.is_some()
    }

    /// The current call, as this rank made it.
    pub(crate) fn current(&self) -> CallDescriptor {
        self.current.expect("only asked inside a call")
    }

    pub(crate) fn last(&self) -> Option<CallDescriptor> {
        self.last
    }

    pub(crate) fn fill_measured(&self) -> bool {
        self.fill_chooser.is_some()
    }

    /// The descriptor of a call this rank makes, its decisions still open.
    pub(crate) fn describe(
        kind: CallKind,
        dtype: DType,
        op: Option<ReduceOp>,
        count: usize,
        root: usize,
        algorithm: Algorithm,
    ) -> CallDescriptor {
        CallDescriptor {
            kind,
            dtype,
            op,
            count: count as u64,
            root: root as u32,
            algorithm,
            chunk_bytes: 0,
            bypass_slots: false,
        }
    }

    /// The rank that decides `call`'s chunk: rank 0 for the ring calls,
    /// whose descriptor the others wait for and adopt (rank 0 cannot finish
    /// a ring call before every rank has begun it, so its descriptor is
    /// still there), the root for a broadcast, whose chunk reaches the
    /// others on its messages' stamps (a root can run calls ahead of the
    /// chain).
    pub(crate) fn decider(call: &CallDescriptor) -> usize {
        match call.kind {
            CallKind::Broadcast => call.root as usize,
            _ => 0,
        }
    }

    /// The bytes of `call`'s whole message (reduce_scatter's and
    /// all_gather's count is one rank's share).
    pub(crate) fn message_bytes(&self, call: &CallDescriptor) -> usize {
        let count = call.count as usize;
        let elements = match call.kind {
            CallKind::ReduceScatter | CallKind::AllGather => count * self.nranks,
            CallKind::AllReduce | CallKind::Broadcast => count,
        };
        elements * call.dtype.size_bytes()
    }

    /// This rank's decisions for `call`, as its decider: the chunk, and for
    /// the ring's calls the slot fill (measured apart in place and out of
    /// place, as this rank makes the call: their working sets differ).
    pub(crate) fn decide(
        &mut self,
        transport: &Transport,
        call: &mut CallDescriptor,
        in_place: bool,
    ) {
        let message_bytes = self.message_bytes(call);
        call.chunk_bytes = self.chunk_for(transport, message_bytes, call.dtype.size_bytes());
        if call.kind != CallKind::Broadcast {
            call.bypass_slots =
                self.decide_fill(CallClass::new(call.kind, message_bytes, in_place));
        }
    }

    /// The chunk for a message of `message_bytes`: the smallest any rank's
    /// link asks for, within what a slot holds, in whole elements.
    pub(crate) fn chunk_for(
        &self,
        transport: &Transport,
        message_bytes: usize,
        element_bytes: usize,
    ) -> u32 {
        let slot_capacity = transport.sizes().slot_bytes - MESSAGE_HEADER_BYTES;
        let wished = (0..self.nranks)
            .map(|rank| {
                let link = transport.published_link(rank);
                self.chunk_policy.chunk_bytes(link.as_ref(), message_bytes)
            })
            .min()
            .unwrap_or(slot_capacity)
            .clamp(64, slot_capacity);
        (wished / element_bytes * element_bytes) as u32
    }

    /// Whether a ring call of `class` fills its slots past the cache (below
    /// the streaming threshold): what this rank's measurements keep, or the
    /// trial they are due (`slot_fill`). The call's time reaches them in
    /// `finish`.
    fn decide_fill(&mut self, class: CallClass) -> bool {
        let Some(chooser) = &mut self.fill_chooser else {
            return false;
        };
        self.measured = Some((class, monotonic_ns()));
        chooser.choose(class) == SlotFill::Bypass
    }

    /// What rank 0 published for `call` (once it has published this call's
    /// number).
    pub(crate) fn published_by_rank_zero(
        &self,
        transport: &Transport,
        call: &CallDescriptor,
    ) -> Published {
        match transport.published_call(0, self.calls) {
            Some(decided) if decided.same_call(call) => Published::Decided {
                chunk_bytes: decided.chunk_bytes,
                bypass_slots: decided.bypass_slots,
            },
            Some(peer_call) => Published::Differs(peer_call),
            None => Published::Overtaken,
        }
    }

    /// Publishes `call` as this rank's current one.
    pub(crate) fn start(&mut self, transport: &Transport, call: CallDescriptor) {
        transport.publish_call(self.calls, call);
        if self.rank == 0 {
            transport.store(
                0,
                crate::engine::transport::Signal::CallsPublished,
                (self.calls + 1) as u32,
            );
        }
        self.current = Some(call);
    }

    /// Takes the chunk size a broadcast root decided (read from the stamp
    /// on its first message) as this call's.
    pub(crate) fn adopt_chunk_bytes(&mut self, chunk_bytes: u32) {
        if let Some(call) = &mut self.current {
            call.chunk_bytes = chunk_bytes;
        }
    }

    /// Ends the current call: the time of a ring call that succeeded having
    /// filled its slots as `fill` goes to the fill measurements (unless its
    /// working set took the raw slots past the cache, whatever was chosen:
    /// it says nothing about the choice).
    pub(crate) fn finish(&mut self, fill: Option<SlotFill>) {
        if let (Some(chooser), Some((class, started)), Some(fill)) =
            (&mut self.fill_chooser, self.measured.take(), fill)
        {
            if fill != SlotFill::RawBypass {
                chooser.record(class, monotonic_ns().saturating_sub(started));
            }
        }
        self.calls += 1;
        self.last = self.current.take();
    }

    /// Whether a slot holds a chunk of `chunk_bytes` (a peer's decision).
    pub(crate) fn chunk_fits(transport: &Transport, chunk_bytes: u32) -> bool {
        let capacity = transport.sizes().slot_bytes - MESSAGE_HEADER_BYTES;
        chunk_bytes != 0 && chunk_bytes as usize <= capacity
    }

    /// `peer`'s published descriptor of the current call, where it differs
    /// from ours: (ours, theirs).
    pub(crate) fn differs_from(
        &self,
        transport: &Transport,
        peer: usize,
    ) -> Option<(CallDescriptor, CallDescriptor)> {
        let call = self.current?;
        transport
            .published_call(peer, self.calls)
            .filter(|peer_call| !peer_call.same_call(&call))
            .map(|peer_call| (call, peer_call))
    }

    /// Checks the stamp a peer wrote on a message it published (`stamp`:
    /// its call number and descriptor words) against our call: the peer's
    /// call (with the chunk size it moves in), or the call it made instead
    /// (ours under another call number where the stamp does not decode).
    /// The stamp travels with the data, so this holds however many calls
    /// ahead the peer has run (a broadcast chain lets it run ahead).
    pub(crate) fn check_stamp(&self, stamp: [u64; 4]) -> Result<CallDescriptor, CallDescriptor> {
        let call = self.current();
        let peer_call = CallDescriptor::from_words([stamp[1], stamp[2], stamp[3]]);
        match peer_call {
            Some(peer_call) if stamp[0] == self.calls && peer_call.same_call(&call) => {
                Ok(peer_call)
            }
            // The same call under another call number means the peer's
            // sequence of calls diverged from ours.
            _ => Err(peer_call.unwrap_or(call)),
        }
    }

    /// The stamp of the current call, as messages carry it: its number, its
    /// descriptor's head and count, and its chunk size alone in the low half
    /// of the fourth word, whose high half is the message's checksum
    /// (`message::check_word`). The slot fill, which the descriptor keeps in
    /// that half, stays out: on a checksummed message it would corrupt the
    /// checksum (every resend alike), and receivers take it from rank 0's
    /// published descriptor, not from stamps.
    pub(crate) fn stamp(&self) -> [u64; 4] {
        let call = self.current();
        let [head, count, _] = call.to_words();
        [self.calls, head, count, u64::from(call.chunk_bytes)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_leaves_the_checksum_half_to_the_checksum() {
        let mut agreement = Agreement::new(0, 3, ChunkPolicy::default(), None);
        let mut call = Agreement::describe(
            CallKind::AllReduce,
            DType::F32,
            Some(ReduceOp::Sum),
            1 << 20,
            0,
            Algorithm::Ring,
        );
        call.chunk_bytes = 1 << 20;
        call.bypass_slots = true;
        agreement.current = Some(call);
        let stamp = agreement.stamp();
        assert_eq!(stamp[3], 1 << 20, "the chunk size alone");
        assert_eq!(stamp[1..3], call.to_words()[..2]);
        let decoded =
            CallDescriptor::from_words([stamp[1], stamp[2], stamp[3]]).expect("a stamp decodes");
        assert!(decoded.same_call(&call));
        assert_eq!(decoded.chunk_bytes, 1 << 20);
    }
}
