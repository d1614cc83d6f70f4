//! The slots ranks hand each other, behind typed guards: with the checksums'
//! `Shadows` and `CheckedCopies`, the only code of the engine that reads and
//! writes shared windows by pointer.
//!
//! A rank sends on two streams to its successor (`Stream`), each a ring of
//! slots counted by a posted and a consumed counter, and publishes one-shot
//! windows by rounds. A slot it fills is an [`Outgoing`] until it posts it;
//! a message it reads is an [`Incoming`] until it releases it. The guards
//! move into `post` and `release`, so a slot is not touched after it was
//! handed over. With chunk checksums a guard points at host memory instead:
//! the slot's shadow being filled, or the checked copy of a message.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::checked::{one_shot_check_word, CheckedCopies, ResendRecord};
use super::message::{
    data_of, one_shot_data_of, Stream, MESSAGE_HEADER_BYTES, ONE_SHOT_SPILLED_DATA,
};
use super::peers::Peers;
use crate::engine::error::EngineError;
use crate::engine::transport::{Signal, Transport, Window};

/// The most bytes of its messages one ring call cycles through on each
/// stream. A call takes as many of a stream's raw slots as this holds of
/// its largest message (at least 2, at most the stream's), runs one chunk
/// fewer ahead than it has slots, and takes as many relay slots per ring
/// step. A size's first message backs every slot of its cycle, and each
/// slot's first use runs slower than its reuse (its lines are in no cache
/// yet), so a shorter cycle shortens a new size's first calls. On the
/// 2-vCPU AMD EPYC, 2 ranks, two slots of 256 KiB against five took a 512
/// KiB all_reduce from cold to within 10% of its steady time in 5 calls
/// against 8 (medians of 331 alternating runs; its first call 1.1 ms
/// against 2.2) and 1 MiB in 5 against 6, with busbw from 256 KiB to 4 MiB
/// 0.92–1.25 times the five slots' per size and placement in two
/// alternations of 10 and 12 rounds (256 KiB, whose slots did not change,
/// 0.97–0.98: their noise). Messages up to 128 KiB keep five slots. A
/// constant, so that every rank counts the same slots from the agreed call.
const SLOT_CYCLE_BYTES: usize = 640 << 10;

/// How many of its slots each stream cycles through for a ring call whose
/// largest message is `message_bytes`, of `raw_slots` raw and `relay_slots`
/// relay slots (the relay stream carrying `relay_slots / raw_slots` ring
/// steps): `SLOT_CYCLE_BYTES` of messages, at least 2 raw slots; the relay
/// stream as many per step as the raw one, so that every step may run as
/// far ahead as the first.
fn ring_slots(message_bytes: usize, raw_slots: usize, relay_slots: usize) -> (usize, usize) {
    let raw = (SLOT_CYCLE_BYTES / message_bytes.max(1))
        .max(2)
        .min(raw_slots);
    let relay_steps = relay_slots / raw_slots.max(1);
    (raw, (raw * relay_steps).min(relay_slots))
}

/// A rank's counts of the messages it sent and received on one stream,
/// which of the stream's slots they cycle through (the first `in_use`,
/// counted from the message numbers at which that count took effect), and
/// how much of each slot is backed in this process.
struct StreamCounts {
    sent: u32,
    received: u32,
    sent_base: u32,
    received_base: u32,
    in_use: u32,
    /// Bytes from the start of each of this rank's slots that are backed
    /// (`Transport::prepare`), and of each of the predecessor's.
    backed: Vec<usize>,
    predecessor_backed: Vec<usize>,
}

impl StreamCounts {
    /// A stream of `slots` slots, all in use.
    fn new(slots: usize) -> StreamCounts {
        StreamCounts {
            sent: 0,
            received: 0,
            sent_base: 0,
            received_base: 0,
            in_use: slots as u32,
            backed: vec![0; slots],
            predecessor_backed: vec![0; slots],
        }
    }

    /// The slot of this rank's `sent`-th message (from 0).
    fn sent_slot(&self, sent: u32) -> usize {
        (sent.wrapping_sub(self.sent_base) % self.in_use) as usize
    }

    /// The slot of the predecessor's `received`-th message.
    fn received_slot(&self, received: u32) -> usize {
        (received.wrapping_sub(self.received_base) % self.in_use) as usize
    }

    /// Backs `bytes` (stamp included) of every slot in use on `stream`,
    /// this rank's or the predecessor's (`from`), where `slot`, the next
    /// one used, is not yet: a message size's first message prepares the
    /// whole cycle, so the calls after it touch no new page. On demand
    /// paged memory the first touch of each page is a fault (about 2 µs on
    /// a VM, with its zeroing); left to the calls, a 64 KiB all_reduce's
    /// first five calls took 7× the steady time, one per raw slot, before
    /// every slot of the cycle had been touched once (docs/engine.md, Slots
    /// backed before use).
    fn back(
        &mut self,
        transport: &Transport,
        stream: Stream,
        from: usize,
        slot: usize,
        bytes: usize,
    ) {
        let backed = if from == transport.rank() {
            &mut self.backed
        } else {
            &mut self.predecessor_backed
        };
        if backed[slot] >= bytes {
            return;
        }
        for (slot, backed) in backed.iter_mut().enumerate().take(self.in_use as usize) {
            if *backed < bytes {
                transport.prepare(from, stream.window(slot), bytes);
                *backed = bytes;
            }
        }
    }
}

/// A slot or one-shot window of this rank's, being filled: only this rank
/// touches it until it hands it over.
pub(crate) struct Outgoing<T> {
    data: NonNull<T>,
    len: usize,
}

/// A peer's message: the peer leaves it alone until this rank releases it
/// (a stream slot) or posts its next round (a one-shot window).
pub(crate) struct Incoming<T> {
    data: NonNull<T>,
    len: usize,
}

impl<T> Deref for Outgoing<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `data` points at `len` elements of a window this rank owns
        // until it posts it (which consumes the guard), or of the window's
        // shadow, which nothing else touches before then; the transport's
        // mapping outlives every call.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for Outgoing<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; nobody else reads or writes the window
        // before it is posted.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.len) }
    }
}

impl<T> Deref for Incoming<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `data` points at `len` elements the peer published and
        // does not write again until this rank hands the message back, or at
        // this rank's checked copy of them, which it leaves alone until then
        // (`CheckedCopies::held`; one-shot copies: until the next round).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }
}

/// The last word of `owner`'s one-shot window stamp of `parity`: its low
/// half is the round the window holds, stored after everything else the
/// window holds (release).
fn one_shot_round_word<'a>(transport: &Transport, owner: usize, parity: usize) -> &'a AtomicU64 {
    let start = transport
        .window(owner, Window::OneShot { parity })
        .cast::<u64>();
    // SAFETY: the window is page aligned and starts with the four-word
    // stamp; the mapping lives as long as the transport, which outlives
    // every call's use of the word; the word is only accessed atomically
    // once windows are in use (its owner's plain writes happen before it
    // first posts).
    unsafe { AtomicU64::from_ptr(start.add(3)) }
}

/// A rank's two streams and its one-shot rounds.
pub(crate) struct SlotStreams {
    raw: StreamCounts,
    relay: StreamCounts,
    /// Rounds posted on this rank's one-shot counter: one-shot windows, and
    /// the direct algorithm's three meetings per call.
    one_shot_rounds: u32,
    /// Whether the stamp on this call's first message from the predecessor
    /// has been checked against our call.
    predecessor_checked: bool,
    /// The checked copies of what this rank reads, where chunk checksums
    /// are on.
    checked: Option<CheckedCopies>,
}

impl SlotStreams {
    pub(crate) fn new(
        raw_slots: usize,
        relay_slots: usize,
        checked: Option<CheckedCopies>,
    ) -> SlotStreams {
        SlotStreams {
            raw: StreamCounts::new(raw_slots),
            relay: StreamCounts::new(relay_slots),
            one_shot_rounds: 0,
            predecessor_checked: false,
            checked,
        }
    }

    /// The messages that arrived damaged and were read again until whole.
    pub(crate) fn resends(&self) -> &[ResendRecord] {
        self.checked
            .as_ref()
            .map_or(&[], |checked| checked.resends())
    }

    /// A new call starts: its first message's stamp is still to be checked.
    pub(crate) fn begin_call(&mut self) {
        self.predecessor_checked = false;
    }

    fn counts(&mut self, stream: Stream) -> &mut StreamCounts {
        match stream {
            Stream::Raw => &mut self.raw,
            Stream::Relay => &mut self.relay,
        }
    }

    /// Messages this rank has posted on `stream`.
    pub(crate) fn sent(&self, stream: Stream) -> u32 {
        match stream {
            Stream::Raw => self.raw.sent,
            Stream::Relay => self.relay.sent,
        }
    }

    /// Rounds posted on this rank's one-shot counter.
    pub(crate) fn one_shot_rounds(&self) -> u32 {
        self.one_shot_rounds
    }

    /// Starts a ring call whose largest message is `message_bytes` on the
    /// slots it cycles through (`ring_slots`), and returns how many raw ones.
    pub(crate) fn use_slots_for_ring(
        &mut self,
        peers: &mut Peers,
        message_bytes: usize,
    ) -> Result<usize, EngineError> {
        let sizes = peers.transport.sizes();
        let (raw, relay) = ring_slots(message_bytes, sizes.raw_slots, sizes.relay_slots);
        self.use_slots(peers, Stream::Raw, raw as u32)?;
        self.use_slots(peers, Stream::Relay, relay as u32)?;
        Ok(raw)
    }

    /// Starts a broadcast on every raw slot: ranks other than the root learn
    /// the chunk only from the first message, so its slot cannot depend on it.
    pub(crate) fn use_raw_slots_for_broadcast(
        &mut self,
        peers: &mut Peers,
    ) -> Result<(), EngineError> {
        let all = peers.transport.sizes().raw_slots as u32;
        self.use_slots(peers, Stream::Raw, all)
    }

    /// Makes `stream` cycle through its first `slots` slots from this call
    /// on. Every rank makes the same change at the same call, at its start:
    /// a change first waits until the successor has consumed every message
    /// this rank sent on the stream (it does so in the call that carried
    /// them, which this rank has finished), and this rank has consumed
    /// every one from its predecessor, so both sides count the new cycle
    /// from the same message.
    fn use_slots(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
        slots: u32,
    ) -> Result<(), EngineError> {
        let counts = self.counts(stream);
        if slots == counts.in_use {
            return Ok(());
        }
        let sent = counts.sent;
        let (_, consumed) = stream.signals();
        peers.wait_for(peers.successor(), peers.rank, consumed, sent)?;
        let counts = self.counts(stream);
        counts.sent_base = sent;
        counts.received_base = counts.received;
        counts.in_use = slots;
        Ok(())
    }

    /// Writes the current call's stamp at the start of a window of ours
    /// that no peer may read until we publish it, with `check_word` (the
    /// message's checksum and flag, or 0) in its chunk-size word.
    fn write_stamp(peers: &Peers, window: Window, check_word: u64) {
        let mut stamp = peers.agreement.stamp();
        stamp[3] |= check_word;
        let start = peers.transport.window(peers.rank, window).cast::<u64>();
        // SAFETY: the stamp fills the first MESSAGE_HEADER_BYTES of a page
        // aligned window that is ours until we publish it.
        unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), start, stamp.len()) };
    }

    /// Checks the stamp `peer` wrote on a window it published; returns the
    /// chunk size it carries.
    fn read_stamp(peers: &mut Peers, peer: usize, window: Window) -> Result<u32, EngineError> {
        let start = peers
            .transport
            .window(peer, window)
            .cast::<u64>()
            .cast_const();
        let mut stamp = [0u64; 4];
        // SAFETY: the peer wrote the stamp before publishing, and does not
        // touch the window until we are done with it.
        unsafe { std::ptr::copy_nonoverlapping(start, stamp.as_mut_ptr(), stamp.len()) };
        // The low half is the chunk size, or on a one-shot window (whose
        // calls move no chunks) the round.
        stamp[3] = match window {
            Window::OneShot { .. } => 0,
            _ => stamp[3] & u64::from(u32::MAX),
        };
        Ok(peers.check_stamp(peer, stamp)?.chunk_bytes)
    }

    /// Waits for this rank's next slot on `stream` to be free and returns it
    /// for `len` elements.
    pub(crate) fn send_slot<T: Copy>(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
        len: usize,
    ) -> Result<Outgoing<T>, EngineError> {
        // A step boundary: the faults on this rank's link are acted on here
        // as well as between calls, so a non-fatal error pauses the call in
        // flight at its next step until the kernel's recovery ends, and a
        // fatal one fails it there.
        peers.follow_faults()?;
        peers.serve_resends();
        let counts = self.counts(stream);
        let (sent, slots) = (counts.sent, counts.in_use);
        let (_, consumed) = stream.signals();
        peers.wait_for(
            peers.successor(),
            peers.rank,
            consumed,
            sent.wrapping_add(1).wrapping_sub(slots),
        )?;
        let slot = self.counts(stream).sent_slot(sent);
        let bytes = MESSAGE_HEADER_BYTES + len * std::mem::size_of::<T>();
        self.counts(stream)
            .back(&peers.transport, stream, peers.rank, slot, bytes);
        let data = match &mut peers.shadows {
            Some(shadows) => shadows
                .fill(stream, slot, len * std::mem::size_of::<T>())
                .cast(),
            None => data_of(peers.transport.window(peers.rank, stream.window(slot))),
        };
        Ok(Outgoing { data, len })
    }

    /// Stamps the slot `filled` (from `send_slot`) with the current call
    /// and hands it to the successor.
    pub(crate) fn post<T>(&mut self, peers: &mut Peers, stream: Stream, filled: Outgoing<T>) {
        let counts = self.counts(stream);
        let sent = counts.sent;
        let slot = counts.sent_slot(sent);
        let window = stream.window(slot);
        let check_word = match &mut peers.shadows {
            Some(shadows) => shadows.post(
                stream,
                slot,
                peers.transport.window(peers.rank, window),
                sent.wrapping_add(1),
                filled.len * std::mem::size_of::<T>(),
            ),
            None => 0,
        };
        Self::write_stamp(peers, window, check_word);
        let counts = self.counts(stream);
        counts.sent = counts.sent.wrapping_add(1);
        let sent = counts.sent;
        let (posted, _) = stream.signals();
        peers.transport.store(peers.rank, posted, sent);
    }

    /// Sends the address of `chunk` (finished, in this rank's output) on the
    /// relay stream, for the successor to read in place.
    pub(crate) fn send_address<T>(
        &mut self,
        peers: &mut Peers,
        chunk: &[T],
    ) -> Result<(), EngineError> {
        let mut slot = self.send_slot::<i64>(peers, Stream::Relay, 1)?;
        slot[0] = chunk.as_ptr() as i64;
        self.post(peers, Stream::Relay, slot);
        Ok(())
    }

    /// Waits for the predecessor's next message on `stream` and returns the
    /// window that holds it.
    fn next_from_predecessor(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
    ) -> Result<Window, EngineError> {
        let predecessor = peers.predecessor();
        let received = self.counts(stream).received;
        let (posted, _) = stream.signals();
        peers.wait_for(predecessor, predecessor, posted, received.wrapping_add(1))?;
        Ok(stream.window(self.counts(stream).received_slot(received)))
    }

    /// Waits for the predecessor's next message on `stream` and returns it
    /// as `len` elements; the call's first message has its stamp checked.
    pub(crate) fn receive<T: Copy>(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
        len: usize,
    ) -> Result<Incoming<T>, EngineError> {
        let predecessor = peers.predecessor();
        let window = self.next_from_predecessor(peers, stream)?;
        if !self.predecessor_checked {
            Self::read_stamp(peers, predecessor, window)?;
            self.predecessor_checked = true;
        }
        let counts = self.counts(stream);
        let slot = counts.received_slot(counts.received);
        let bytes = MESSAGE_HEADER_BYTES + len * std::mem::size_of::<T>();
        counts.back(&peers.transport, stream, predecessor, slot, bytes);
        let message = self.counts(stream).received.wrapping_add(1);
        let data = match &mut self.checked {
            Some(checked) => checked
                .take_message(
                    peers,
                    stream,
                    window,
                    message,
                    len * std::mem::size_of::<T>(),
                )?
                .cast(),
            None => data_of(peers.transport.window(predecessor, window)),
        };
        Ok(Incoming { data, len })
    }

    /// Waits for the predecessor's first message of this call on `stream`,
    /// checks its stamp, and returns the chunk size written on it (a
    /// broadcast root's decision, passed down the chain), which it takes as
    /// this call's.
    pub(crate) fn adopt_stamped_chunk(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
    ) -> Result<u32, EngineError> {
        let predecessor = peers.predecessor();
        let window = self.next_from_predecessor(peers, stream)?;
        let chunk_bytes = Self::read_stamp(peers, predecessor, window)?;
        let chunk_bytes = peers.check_chunk(predecessor, chunk_bytes)?;
        self.predecessor_checked = true;
        peers.agreement.adopt_chunk_bytes(chunk_bytes);
        Ok(chunk_bytes)
    }

    /// Hands the predecessor's message back: it may reuse the slot.
    pub(crate) fn release<T>(&mut self, peers: &Peers, stream: Stream, _read: Incoming<T>) {
        if let Some(checked) = &mut self.checked {
            checked.drop_message(stream);
        }
        let counts = self.counts(stream);
        counts.received = counts.received.wrapping_add(1);
        let received = counts.received;
        let (_, consumed) = stream.signals();
        peers
            .transport
            .store(peers.predecessor(), consumed, received);
    }

    /// Posts this rank's next round on its one-shot counter.
    pub(crate) fn post_round(&mut self, peers: &Peers) {
        self.one_shot_rounds = self.one_shot_rounds.wrapping_add(1);
        peers
            .transport
            .store(peers.rank, Signal::OneShotPosted, self.one_shot_rounds);
    }

    /// Waits until `peer` has posted this rank's current round on its
    /// one-shot counter (the direct algorithm's meetings).
    pub(crate) fn wait_for_round(&self, peers: &mut Peers, peer: usize) -> Result<(), EngineError> {
        peers.wait_for(peer, peer, Signal::OneShotPosted, self.one_shot_rounds)
    }

    /// Publishes `data` in this rank's one-shot window of `parity`, stamped
    /// with the current call, and posts the round. Every peer finished
    /// reading the window two rounds ago (they posted the round after it,
    /// which they only do once done), so it is ours until we post.
    ///
    /// The stamp's last word, stored last with release ordering, carries
    /// the round in its low half (one-shot calls move no chunks): a peer
    /// polling it (`wait_for_one_shot`) finds the round and, for small
    /// messages, the data in the same cache line, one transfer between
    /// cores where the posted counter would cost a second.
    ///
    /// The data goes first and the whole stamp after it: the peer polls
    /// the stamp's line, so a stamp written before the data was taken back
    /// by the poll while the data was copied, and the round word then had
    /// to take the line again (512 B calls 1.5 times as long on a 2-vCPU
    /// Xeon).
    pub(crate) fn post_one_shot<T: Copy>(&mut self, peers: &Peers, parity: usize, data: &[T]) {
        let window = Window::OneShot { parity };
        let bytes = std::mem::size_of_val(data);
        let round = self.one_shot_rounds.wrapping_add(1);
        let check_word = if self.checked.is_some() {
            // SAFETY: `data` is `bytes` of plain elements.
            let raw = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), bytes) };
            one_shot_check_word(round, raw)
        } else {
            0
        };
        let mut stamp = peers.agreement.stamp();
        debug_assert_eq!(stamp[3], 0, "one-shot and direct calls have no chunk size");
        stamp[3] = check_word | u64::from(round);
        let transport = &peers.transport;
        let start = transport.window(peers.rank, window).cast::<u64>();
        let mut outgoing = Outgoing::<T> {
            data: one_shot_data_of(transport.window(peers.rank, window), bytes),
            len: data.len(),
        };
        outgoing.copy_from_slice(data);
        // SAFETY: the stamp fills the first MESSAGE_HEADER_BYTES of a page
        // aligned window that is ours until we post; its last word is
        // written below, atomically.
        unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), start, 3) };
        one_shot_round_word(transport, peers.rank, parity).store(stamp[3], Ordering::Release);
        self.post_round(peers);
    }

    /// Waits until `owner` has posted this rank's current round in its
    /// one-shot window of `parity`: polls the window's own round word (the
    /// data's cache line for small messages) for the spin, then waits on
    /// the posted counter.
    pub(crate) fn wait_for_one_shot(
        &self,
        peers: &mut Peers,
        owner: usize,
        parity: usize,
    ) -> Result<(), EngineError> {
        let round = self.one_shot_rounds;
        if peers.trace.is_some() {
            // Traced, the wait is recorded as every other is.
            return peers.wait_for(owner, owner, Signal::OneShotPosted, round);
        }
        let word = one_shot_round_word(&peers.transport, owner, parity);
        peers.wait_until(owner, owner, Signal::OneShotPosted, round, || {
            word.load(Ordering::Acquire) as u32 == round
        })
    }

    /// Takes `owner`'s one-shot window of `parity` for this round, `len`
    /// elements, once it has posted the round (this rank's own included):
    /// its stamp checked against the call where `check_stamp`, and with
    /// chunk checksums its data copied and checked.
    pub(crate) fn take_one_shot_window<T: Copy>(
        &mut self,
        peers: &mut Peers,
        owner: usize,
        parity: usize,
        len: usize,
        check_stamp: bool,
    ) -> Result<(), EngineError> {
        if check_stamp {
            Self::read_stamp(peers, owner, Window::OneShot { parity })?;
        }
        if let Some(checked) = &mut self.checked {
            let bytes = len * std::mem::size_of::<T>();
            checked.take_one_shot(peers, owner, parity, self.one_shot_rounds, bytes)?;
        }
        Ok(())
    }

    /// `owner`'s one-shot message of `parity` as `len` elements, once taken
    /// with `take_one_shot_window`.
    pub(crate) fn one_shot_data<T: Copy>(
        &self,
        peers: &Peers,
        owner: usize,
        parity: usize,
        len: usize,
    ) -> Incoming<T> {
        let data = match &self.checked {
            Some(checked) => checked.one_shot_copy(owner),
            None => one_shot_data_of(
                peers.transport.window(owner, Window::OneShot { parity }),
                len * std::mem::size_of::<T>(),
            ),
        };
        Incoming {
            data: data.cast(),
            len,
        }
    }

    /// The bytes of the largest message a one-shot window holds.
    pub(crate) fn one_shot_capacity(peers: &Peers) -> usize {
        peers.transport.sizes().one_shot_bytes - ONE_SHOT_SPILLED_DATA
    }

    /// Waits until the successor has consumed every message this rank sent,
    /// serving its resends meanwhile, where chunk checksums are on: a call
    /// ends only when nothing it sent can still be asked for again.
    pub(crate) fn drain(&self, peers: &mut Peers) -> Result<(), EngineError> {
        if peers.shadows.is_none() || peers.nranks == 1 {
            return Ok(());
        }
        for stream in [Stream::Raw, Stream::Relay] {
            let sent = self.sent(stream);
            peers.wait_for(peers.successor(), peers.rank, stream.signals().1, sent)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_cycles_through_640_kib_of_its_messages_on_each_stream() {
        // 2 ranks, the default 5 slots a stream: the relay stream carries
        // one step, as many slots as raw.
        assert_eq!(ring_slots(32 << 10, 5, 5), (5, 5));
        assert_eq!(ring_slots(128 << 10, 5, 5), (5, 5));
        assert_eq!(ring_slots(160 << 10, 5, 5), (4, 4));
        // At least two raw slots, even for messages past the cycle.
        assert_eq!(ring_slots(256 << 10, 5, 5), (2, 2));
        assert_eq!(ring_slots(1 << 20, 5, 5), (2, 2));
        // 4 ranks: five relay steps, each as deep as the raw stream.
        assert_eq!(ring_slots(256 << 10, 5, 25), (2, 10));
        assert_eq!(ring_slots(64 << 10, 5, 25), (5, 25));
        // A deeper stream (--in-flight 15) cycles through more of it.
        assert_eq!(ring_slots(32 << 10, 16, 16), (16, 16));
        assert_eq!(ring_slots(64 << 10, 16, 48), (10, 30));
        assert_eq!(ring_slots(0, 3, 3), (3, 3));
    }
}
