//! The slots ranks hand each other, behind typed guards: with `checksums`
//! (the checked copies of them), the only place in the communicator that
//! reads and writes shared windows by pointer.
//!
//! A rank sends on two streams to its successor (Raw: the first ring step,
//! which may run ahead; Relay: every later step and broadcast), each a ring
//! of slots counted by a posted and a consumed counter, and publishes
//! one-shot windows by rounds. A slot it fills is an [`Outgoing`] until it
//! posts it; a message it reads is an [`Incoming`] until it releases it.
//! The guards move into `post` and `release`, so a slot is not touched after
//! it was handed over. With chunk checksums a guard points at host memory
//! instead: the slot's shadow being filled, or the checked copy of a message.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::checksums::one_shot_check_word;
use super::Communicator;
use crate::engine::error::EngineError;
use crate::engine::failure::Carrier;
use crate::engine::transport::{Signal, Window};

/// Every Raw and Relay slot and one-shot window starts with its writer's call
/// number and call descriptor (four words; the chunk-size word also carries
/// the message's checksum where they are on), then the data: for small
/// messages stamp and data share a cache line, one transfer between cores.
pub(crate) const MESSAGE_HEADER_BYTES: usize = 32;

/// The most bytes of raw slots one ring call cycles through. A call whose
/// chunks are large takes fewer slots than the stream has (at least 2) and
/// runs that many fewer chunks ahead: the chunks it hands over are read while
/// still in the cache, and the calls after it do not walk through every
/// slot's memory. On the 2-vCPU AMD EPYC, 2 ranks, two slots of 1 MiB
/// against five were 9–57% ahead at 2–8 MiB and level elsewhere, while five
/// slots of 256 KiB against two were 25–40% ahead at 256 KiB, where calls
/// are short and the slack between calls counts (docs/engine.md). A
/// constant, so that every rank counts the same slots from the call's
/// agreed chunk.
const RAW_SLOTS_BYTES: usize = 2 << 20;

/// The two streams a rank sends to its successor and receives from its
/// predecessor.
#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Raw,
    Relay,
}

impl Stream {
    pub(crate) fn window(self, slot: usize) -> Window {
        match self {
            Stream::Raw => Window::Raw { slot },
            Stream::Relay => Window::Relay { slot },
        }
    }

    /// Its (posted, consumed) counters.
    pub(crate) fn signals(self) -> (Signal, Signal) {
        match self {
            Stream::Raw => (Signal::RawPosted, Signal::RawConsumed),
            Stream::Relay => (Signal::RelayPosted, Signal::RelayConsumed),
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub(crate) fn carrier(self) -> Carrier {
        match self {
            Stream::Raw => Carrier::RawSlot,
            Stream::Relay => Carrier::RelaySlot,
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
        // (`Checksums::held`; one-shot copies: until the next round).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }
}

/// The data of `window` (past its stamp) as `len` elements.
pub(crate) fn data_of<T>(window: *mut u8) -> NonNull<T> {
    // SAFETY: every window is page aligned and holds its stamp and then at
    // least a chunk (slots) or a one-shot message (one-shot windows), which
    // `len` never exceeds.
    NonNull::new(unsafe { window.add(MESSAGE_HEADER_BYTES) }.cast::<T>())
        .expect("windows are never at address 0")
}

impl Communicator {
    fn counts(&mut self, stream: Stream) -> &mut super::StreamCounts {
        match stream {
            Stream::Raw => &mut self.raw,
            Stream::Relay => &mut self.relay,
        }
    }

    fn counts_of(&self, stream: Stream) -> &super::StreamCounts {
        match stream {
            Stream::Raw => &self.raw,
            Stream::Relay => &self.relay,
        }
    }

    /// Messages this rank has posted on `stream`.
    pub(crate) fn sent(&self, stream: Stream) -> u32 {
        self.counts_of(stream).sent
    }

    /// The slots `stream`'s messages cycle through now.
    pub(crate) fn slots(&self, stream: Stream) -> u32 {
        self.counts_of(stream).in_use
    }

    /// The slot of this rank's `sent`-th message on `stream` (from 0).
    pub(crate) fn sent_slot(&self, stream: Stream, sent: u32) -> usize {
        let counts = self.counts_of(stream);
        (sent.wrapping_sub(counts.sent_base) % counts.in_use) as usize
    }

    /// The slot of the predecessor's `received`-th message on `stream`.
    fn received_slot(&self, stream: Stream, received: u32) -> usize {
        let counts = self.counts_of(stream);
        (received.wrapping_sub(counts.received_base) % counts.in_use) as usize
    }

    /// Starts a ring call in chunks of `chunk_bytes` on the raw slots it
    /// cycles through, as many as `RAW_SLOTS_BYTES` holds (at least 2, at
    /// most the stream's), and returns how many.
    pub(crate) fn use_raw_slots_for_ring(
        &mut self,
        chunk_bytes: u32,
    ) -> Result<usize, EngineError> {
        let all = self.transport.sizes().raw_slots;
        let slots = (RAW_SLOTS_BYTES / (chunk_bytes as usize).max(1))
            .max(2)
            .min(all);
        self.use_raw_slots(slots as u32)?;
        Ok(slots)
    }

    /// Starts a broadcast on every raw slot: ranks other than the root learn
    /// the chunk only from the first message, so its slot cannot depend on it.
    pub(crate) fn use_raw_slots_for_broadcast(&mut self) -> Result<(), EngineError> {
        self.use_raw_slots(self.transport.sizes().raw_slots as u32)
    }

    /// Makes the raw stream cycle through its first `slots` slots from this
    /// call on. Every rank makes the same change at the same call, at its
    /// start: a change first waits until the successor has consumed every
    /// raw message this rank sent (it does so in the call that carried
    /// them, which this rank has finished), and this rank has consumed
    /// every one from its predecessor, so both sides count the new cycle
    /// from the same message.
    fn use_raw_slots(&mut self, slots: u32) -> Result<(), EngineError> {
        if slots == self.raw.in_use {
            return Ok(());
        }
        let sent = self.raw.sent;
        self.wait_for(self.successor(), self.rank, Signal::RawConsumed, sent)?;
        self.raw.sent_base = sent;
        self.raw.received_base = self.raw.received;
        self.raw.in_use = slots;
        Ok(())
    }

    /// Writes the current call's stamp at the start of a window of ours
    /// that no peer may read until we publish it, with `check_word` (the
    /// message's checksum and flag, or 0) in its chunk-size word.
    fn write_stamp(&self, window: Window, check_word: u64) {
        let mut stamp = self.stamp();
        stamp[3] |= check_word;
        let start = self.transport.window(self.rank, window).cast::<u64>();
        // SAFETY: the stamp fills the first MESSAGE_HEADER_BYTES of a page
        // aligned window that is ours until we publish it.
        unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), start, stamp.len()) };
    }

    /// Checks the stamp `peer` wrote on a window it published.
    fn read_stamp(&mut self, peer: usize, window: Window) -> Result<u32, EngineError> {
        let start = self
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
        Ok(self.check_stamp(peer, stamp)?.chunk_bytes)
    }

    /// The chunk-size word of the stamp `peer` wrote on a window it
    /// published: its checksum half.
    pub(crate) fn stamp_check_word(&self, peer: usize, window: Window) -> u64 {
        let start = self.transport.window(peer, window).cast::<u64>();
        // SAFETY: as in `read_stamp`; the word is the stamp's fourth. Volatile:
        // a damaged message's stamp is read again after its resend.
        let word = unsafe { start.add(3).read_volatile() };
        word & !u64::from(u32::MAX)
    }

    /// Waits for this rank's next slot on `stream` to be free and returns it
    /// for `len` elements.
    pub(crate) fn send_slot<T: Copy>(
        &mut self,
        stream: Stream,
        len: usize,
    ) -> Result<Outgoing<T>, EngineError> {
        // A step boundary: the faults on this rank's link are acted on here
        // as well as between calls, so a non-fatal error pauses the call in
        // flight at its next step until the kernel's recovery ends, and a
        // fatal one fails it there.
        self.follow_link_events()?;
        self.serve_resends();
        let slots = self.slots(stream);
        let sent = self.counts(stream).sent;
        let (_, consumed) = stream.signals();
        self.wait_for(
            self.successor(),
            self.rank,
            consumed,
            sent.wrapping_add(1).wrapping_sub(slots),
        )?;
        let slot = self.sent_slot(stream, sent);
        let data = if self.checksums.is_some() {
            self.shadow_slot(stream, slot, len * std::mem::size_of::<T>())
                .cast()
        } else {
            data_of(self.transport.window(self.rank, stream.window(slot)))
        };
        Ok(Outgoing { data, len })
    }

    /// Stamps `slot` (filled since `send_slot`) with the current call and
    /// hands it to the successor.
    pub(crate) fn post<T>(&mut self, stream: Stream, filled: Outgoing<T>) {
        let sent = self.counts(stream).sent;
        let slot = self.sent_slot(stream, sent);
        let check_word = if self.checksums.is_some() {
            let bytes = filled.len * std::mem::size_of::<T>();
            self.post_shadow(stream, slot, sent.wrapping_add(1), bytes)
        } else {
            0
        };
        self.write_stamp(stream.window(slot), check_word);
        let counts = self.counts(stream);
        counts.sent = counts.sent.wrapping_add(1);
        let sent = counts.sent;
        let (posted, _) = stream.signals();
        self.transport.store(self.rank, posted, sent);
    }

    /// Sends the address of `chunk` (finished, in this rank's output) on the
    /// relay stream, for the successor to read in place.
    pub(crate) fn send_address<T>(&mut self, chunk: &[T]) -> Result<(), EngineError> {
        let mut slot = self.send_slot::<i64>(Stream::Relay, 1)?;
        slot[0] = chunk.as_ptr() as i64;
        self.post(Stream::Relay, slot);
        Ok(())
    }

    /// Waits for the predecessor's next message on `stream` and returns the
    /// window that holds it.
    fn next_from_predecessor(&mut self, stream: Stream) -> Result<Window, EngineError> {
        let predecessor = self.predecessor();
        let received = self.counts(stream).received;
        let (posted, _) = stream.signals();
        self.wait_for(predecessor, predecessor, posted, received.wrapping_add(1))?;
        Ok(stream.window(self.received_slot(stream, received)))
    }

    /// Waits for the predecessor's next message on `stream` and returns it
    /// as `len` elements; the call's first message has its stamp checked.
    pub(crate) fn receive<T: Copy>(
        &mut self,
        stream: Stream,
        len: usize,
    ) -> Result<Incoming<T>, EngineError> {
        let predecessor = self.predecessor();
        let window = self.next_from_predecessor(stream)?;
        if !self.predecessor_checked {
            self.read_stamp(predecessor, window)?;
            self.predecessor_checked = true;
        }
        let data = if self.checksums.is_some() {
            let message = self.counts(stream).received.wrapping_add(1);
            self.take_message(stream, window, message, len * std::mem::size_of::<T>())?
                .cast()
        } else {
            data_of(self.transport.window(predecessor, window))
        };
        Ok(Incoming { data, len })
    }

    /// Waits for the predecessor's first message of this call on `stream`,
    /// checks its stamp, and takes the chunk size written on it as this
    /// call's (a broadcast root's decision, passed down the chain).
    pub(crate) fn adopt_stamped_chunk(&mut self, stream: Stream) -> Result<u32, EngineError> {
        let predecessor = self.predecessor();
        let window = self.next_from_predecessor(stream)?;
        let chunk_bytes = self.read_stamp(predecessor, window)?;
        let chunk_bytes = self.check_chunk(predecessor, chunk_bytes)?;
        self.predecessor_checked = true;
        self.adopt_chunk_bytes(chunk_bytes);
        Ok(chunk_bytes)
    }

    /// Hands the predecessor's message back: it may reuse the slot.
    pub(crate) fn release<T>(&mut self, stream: Stream, _read: Incoming<T>) {
        self.drop_message(stream);
        let counts = self.counts(stream);
        counts.received = counts.received.wrapping_add(1);
        let received = counts.received;
        let (_, consumed) = stream.signals();
        self.transport.store(self.predecessor(), consumed, received);
    }

    /// Publishes `data` in this rank's one-shot window of `parity`, stamped
    /// with the current call, and posts the round. Every peer finished
    /// reading the window two rounds ago (they posted the round after it,
    /// which they only do once done), so it is ours until we post.
    ///
    /// The stamp's last word, stored last with release ordering, carries
    /// the round in its low half (one-shot calls move no chunks): a peer
    /// polling it (`one_shot_round_word`) finds the round and, for small
    /// messages, the data in the same cache line, one transfer between
    /// cores where the posted counter would cost a second.
    pub(crate) fn post_one_shot<T: Copy>(&mut self, parity: usize, data: &[T]) {
        let window = Window::OneShot { parity };
        let bytes = std::mem::size_of_val(data);
        let round = self.one_shot_rounds.wrapping_add(1);
        let check_word = if self.checksums.is_some() {
            // SAFETY: `data` is `bytes` of plain elements.
            let raw = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), bytes) };
            one_shot_check_word(round, raw)
        } else {
            0
        };
        let mut stamp = self.stamp();
        debug_assert_eq!(stamp[3], 0, "one-shot and direct calls have no chunk size");
        stamp[3] = check_word | u64::from(round);
        let start = self.transport.window(self.rank, window).cast::<u64>();
        // SAFETY: the stamp fills the first MESSAGE_HEADER_BYTES of a page
        // aligned window that is ours until we post; its last word is
        // written below, atomically.
        unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), start, 3) };
        let mut outgoing = Outgoing::<T> {
            data: data_of(self.transport.window(self.rank, window)),
            len: data.len(),
        };
        outgoing.copy_from_slice(data);
        self.one_shot_round_word(self.rank, parity)
            .store(stamp[3], Ordering::Release);
        self.post_round();
    }

    /// The last word of `owner`'s one-shot window stamp of `parity`: its
    /// low half is the round the window holds, stored after everything else
    /// the window holds (release).
    pub(crate) fn one_shot_round_word(&self, owner: usize, parity: usize) -> &AtomicU64 {
        let start = self
            .transport
            .window(owner, Window::OneShot { parity })
            .cast::<u64>();
        // SAFETY: the window is page aligned and starts with the four-word
        // stamp; the mapping lives as long as the transport (and so `self`);
        // the word is only accessed atomically once windows are in use
        // (its owner's plain writes happen before it first posts).
        unsafe { AtomicU64::from_ptr(start.add(3)) }
    }

    /// Takes `owner`'s one-shot window of `parity` for this round, `len`
    /// elements, once it has posted the round (this rank's own included):
    /// its stamp checked against the call where `check_stamp`, and with
    /// chunk checksums its data copied and checked.
    pub(crate) fn take_one_shot_window<T: Copy>(
        &mut self,
        owner: usize,
        parity: usize,
        len: usize,
        check_stamp: bool,
    ) -> Result<(), EngineError> {
        if check_stamp {
            self.read_stamp(owner, Window::OneShot { parity })?;
        }
        if self.checksums.is_some() {
            let round = self.one_shot_rounds;
            self.take_one_shot(owner, parity, round, len * std::mem::size_of::<T>())?;
        }
        Ok(())
    }

    /// `owner`'s one-shot message of `parity` as `len` elements, once taken
    /// with `take_one_shot_window`.
    pub(crate) fn one_shot_data<T: Copy>(
        &self,
        owner: usize,
        parity: usize,
        len: usize,
    ) -> Incoming<T> {
        let data = self
            .one_shot_copy(owner)
            .unwrap_or_else(|| data_of(self.transport.window(owner, Window::OneShot { parity })));
        Incoming {
            data: data.cast(),
            len,
        }
    }
}
