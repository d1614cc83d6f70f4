//! The slots ranks hand each other, behind typed guards: the one place in
//! the communicator that reads and writes shared windows by pointer.
//!
//! A rank sends on two streams to its successor (Raw: the first ring step,
//! which may run ahead; Relay: every later step and broadcast), each a ring
//! of slots counted by a posted and a consumed counter, and publishes
//! one-shot windows by rounds. A slot it fills is an [`Outgoing`] until it
//! posts it; a message it reads is an [`Incoming`] until it releases it.
//! The guards move into `post` and `release`, so a slot is not touched after
//! it was handed over.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::Communicator;
use crate::engine::error::EngineError;
use crate::engine::transport::{Signal, Window};

/// Every Raw and Relay slot and one-shot window starts with its writer's call
/// number and call descriptor (four words), then the data: for small
/// messages stamp and data share a cache line, one transfer between cores.
pub(crate) const MESSAGE_HEADER_BYTES: usize = 32;

/// The two streams a rank sends to its successor and receives from its
/// predecessor.
#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Raw,
    Relay,
}

impl Stream {
    fn window(self, slot: u32) -> Window {
        let slot = slot as usize;
        match self {
            Stream::Raw => Window::Raw { slot },
            Stream::Relay => Window::Relay { slot },
        }
    }

    /// Its (posted, consumed) counters.
    fn signals(self) -> (Signal, Signal) {
        match self {
            Stream::Raw => (Signal::RawPosted, Signal::RawConsumed),
            Stream::Relay => (Signal::RelayPosted, Signal::RelayConsumed),
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
        // until it posts it (which consumes the guard); the transport's
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
        // does not write again until this rank hands the message back.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }
}

/// The data of `window` (past its stamp) as `len` elements.
fn data_of<T>(window: *mut u8) -> NonNull<T> {
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

    fn slots(&self, stream: Stream) -> u32 {
        let sizes = self.transport.sizes();
        match stream {
            Stream::Raw => sizes.raw_slots as u32,
            Stream::Relay => sizes.relay_slots as u32,
        }
    }

    /// Writes the current call's stamp at the start of a window of ours
    /// that no peer may read until we publish it.
    fn write_stamp(&self, window: Window) {
        let stamp = self.stamp();
        let start = self.transport.window(self.rank, window).cast::<u64>();
        // SAFETY: the stamp fills the first MESSAGE_HEADER_BYTES of a page
        // aligned window that is ours until we publish it.
        unsafe { std::ptr::copy_nonoverlapping(stamp.as_ptr(), start, stamp.len()) };
    }

    /// Checks the stamp `peer` wrote on a window it published.
    fn read_stamp(&self, peer: usize, window: Window) -> Result<u32, EngineError> {
        let start = self
            .transport
            .window(peer, window)
            .cast::<u64>()
            .cast_const();
        let mut stamp = [0u64; 4];
        // SAFETY: the peer wrote the stamp before publishing, and does not
        // touch the window until we are done with it.
        unsafe { std::ptr::copy_nonoverlapping(start, stamp.as_mut_ptr(), stamp.len()) };
        Ok(self.check_stamp(peer, stamp)?.chunk_bytes)
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
        let slots = self.slots(stream);
        let sent = self.counts(stream).sent;
        let (_, consumed) = stream.signals();
        self.wait_for(
            self.successor(),
            self.rank,
            consumed,
            sent.wrapping_add(1).wrapping_sub(slots),
        )?;
        let window = self
            .transport
            .window(self.rank, stream.window(sent % slots));
        Ok(Outgoing {
            data: data_of(window),
            len,
        })
    }

    /// Stamps `slot` (filled since `send_slot`) with the current call and
    /// hands it to the successor.
    pub(crate) fn post<T>(&mut self, stream: Stream, _filled: Outgoing<T>) {
        let sent = self.counts(stream).sent;
        self.write_stamp(stream.window(sent % self.slots(stream)));
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
        Ok(stream.window(received % self.slots(stream)))
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
        Ok(Incoming {
            data: data_of(self.transport.window(predecessor, window)),
            len,
        })
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
        let counts = self.counts(stream);
        counts.received = counts.received.wrapping_add(1);
        let received = counts.received;
        let (_, consumed) = stream.signals();
        self.transport.store(self.predecessor(), consumed, received);
    }

    /// This rank's one-shot window of `parity`, stamped with the current
    /// call, for `len` elements. Every peer finished reading it two rounds
    /// ago (they posted the round after it, which they only do once done),
    /// so it is ours until we post the next round.
    pub(crate) fn one_shot_window<T: Copy>(&self, parity: usize, len: usize) -> Outgoing<T> {
        let window = Window::OneShot { parity };
        self.write_stamp(window);
        Outgoing {
            data: data_of(self.transport.window(self.rank, window)),
            len,
        }
    }

    /// Checks the stamp on `peer`'s one-shot window of `parity`, once it
    /// has posted the round.
    pub(crate) fn check_one_shot_stamp(
        &self,
        peer: usize,
        parity: usize,
    ) -> Result<(), EngineError> {
        self.read_stamp(peer, Window::OneShot { parity })
            .map(|_| ())
    }

    /// `owner`'s one-shot window of `parity` as `len` elements, once it has
    /// posted the round (this rank's own included).
    pub(crate) fn one_shot_data<T: Copy>(
        &self,
        owner: usize,
        parity: usize,
        len: usize,
    ) -> Incoming<T> {
        Incoming {
            data: data_of(self.transport.window(owner, Window::OneShot { parity })),
            len,
        }
    }
}
