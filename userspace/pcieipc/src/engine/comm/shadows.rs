//! The sending side of chunk checksums (docs/fault-path.md): what a rank
//! posted in each slot, kept in host memory with its checksum until the
//! successor has consumed it, and written to the slot again when the
//! successor asks (`Signal::ResendWanted`). A waiting rank serves those
//! requests between polls, whatever it waits on, so a rank blocked on
//! anything still serves the peer that waits for it.

use std::cell::Cell;
use std::ptr::NonNull;

use super::message::{check_word, data_of, seed, Stream, WANTED_MESSAGE};
use crate::engine::checksum::checksum;
use crate::engine::transport::{Signal, Transport};

/// A fault injected for tests (`CommOptions::damage`): the sending rank flips
/// a byte of one chunk's data in the slot after checksumming it, as damage on
/// its side of the link would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamageInjection {
    /// Which chunk: the index among the chunks this rank posts on its two
    /// streams over the communicator's life, from 0.
    pub chunk: u64,
    /// How many writes of it to damage: the post and then its resends
    /// (more than the receiver's resends makes it stay damaged).
    pub writes: u32,
}

impl std::str::FromStr for DamageInjection {
    type Err = String;

    /// `CHUNK` or `CHUNKxWRITES`.
    fn from_str(text: &str) -> Result<DamageInjection, String> {
        let (chunk, writes) = text.split_once('x').unwrap_or((text, "1"));
        let number = |what: &str, digits: &str| {
            digits.parse::<u64>().map_err(|_| {
                format!("{what} {digits:?} in {text:?} is not a number (CHUNK[xWRITES])")
            })
        };
        let writes = number("writes", writes)?;
        if writes == 0 || writes > u64::from(u32::MAX) {
            return Err(format!("writes must be 1 to {}, not {writes}", u32::MAX));
        }
        Ok(DamageInjection {
            chunk: number("chunk", chunk)?,
            writes: writes as u32,
        })
    }
}

/// What a rank posted in one slot.
#[derive(Default)]
struct Shadow {
    data: Vec<u64>,
    bytes: usize,
    message: u32,
}

/// `buffer` grown to hold `bytes`, as a pointer to its start.
pub(crate) fn room(buffer: &mut Vec<u64>, bytes: usize) -> NonNull<u8> {
    let words = bytes.div_ceil(8);
    if buffer.len() < words {
        buffer.resize(words, 0);
    }
    NonNull::new(buffer.as_mut_ptr().cast::<u8>()).expect("a Vec's pointer is never null")
}

/// The first `bytes` of `buffer`, which `room` grew to hold them.
pub(crate) fn bytes_of(buffer: &[u64], bytes: usize) -> &[u8] {
    assert!(bytes <= std::mem::size_of_val(buffer));
    // SAFETY: u64s are plain bytes, and the buffer holds at least `bytes`.
    unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast::<u8>(), bytes) }
}

/// A rank's posted messages, per stream and slot, until consumed.
pub(crate) struct Shadows {
    /// Per stream (Raw, Relay), per slot.
    slots: [Vec<Shadow>; 2],
    /// Per stream: the number of the last message posted.
    sent: [u32; 2],
    /// Resends of the successor's requests this rank has made.
    served: Cell<u32>,
    posted_chunks: u64,
    damage: Option<DamageInjection>,
    /// The (stream, message) being damaged, and the writes of it still to damage.
    damaging: Cell<Option<(Stream, u32, u32)>>,
}

impl Shadows {
    pub(crate) fn new(
        raw_slots: usize,
        relay_slots: usize,
        damage: Option<DamageInjection>,
    ) -> Shadows {
        let slots = |count: usize| (0..count).map(|_| Shadow::default()).collect();
        Shadows {
            slots: [slots(raw_slots), slots(relay_slots)],
            sent: [0; 2],
            served: Cell::new(0),
            posted_chunks: 0,
            damage,
            damaging: Cell::new(None),
        }
    }

    /// Where this rank fills its next message on `stream` (in slot `slot`):
    /// the slot's shadow, `bytes` long.
    pub(crate) fn fill(&mut self, stream: Stream, slot: usize, bytes: usize) -> NonNull<u8> {
        room(&mut self.slots[stream.index()][slot].data, bytes)
    }

    /// Checksums the shadow of `slot`, filled with message `message` of
    /// `bytes`, and writes it to the slot's `window`; returns the stamp's
    /// chunk-size word's checksum half.
    pub(crate) fn post(
        &mut self,
        stream: Stream,
        slot: usize,
        window: *mut u8,
        message: u32,
        bytes: usize,
    ) -> u64 {
        let shadow = &mut self.slots[stream.index()][slot];
        shadow.bytes = bytes;
        shadow.message = message;
        let sum = checksum(
            seed(stream.carrier(), message),
            bytes_of(&shadow.data, bytes),
        );
        if let Some(damage) = self
            .damage
            .filter(|damage| damage.chunk == self.posted_chunks)
        {
            self.damaging.set(Some((stream, message, damage.writes)));
        }
        self.posted_chunks += 1;
        self.sent[stream.index()] = message;
        self.write(stream, slot, window);
        check_word(sum)
    }

    /// Copies `slot`'s shadow into its `window`, damaged where a test asked.
    fn write(&self, stream: Stream, slot: usize, window: *mut u8) {
        let shadow = &self.slots[stream.index()][slot];
        let data = data_of::<u8>(window).as_ptr();
        // SAFETY: the window is this rank's and holds a chunk past its stamp;
        // the successor reads it only after the posted (or `Resent`) store
        // that follows.
        unsafe {
            std::ptr::copy_nonoverlapping(shadow.data.as_ptr().cast::<u8>(), data, shadow.bytes)
        };
        if let Some((damaged, message, writes)) = self.damaging.get() {
            if damaged == stream && message == shadow.message && writes > 0 && shadow.bytes > 0 {
                // SAFETY: as above; the byte is inside the message.
                unsafe { *data.add(shadow.bytes / 2) ^= 0x5a };
                self.damaging.set(Some((damaged, message, writes - 1)));
            }
        }
    }

    /// Writes again the message the successor asked for, if it asked for
    /// one since the last served, as `rank` of `transport`.
    pub(crate) fn serve(&self, transport: &Transport, rank: usize) {
        let requests = transport.load(rank, Signal::ResendRequests);
        if request_pending(requests, self.served.get()) {
            let wanted = transport.load(rank, Signal::ResendWanted);
            let stream = Stream::of_request(wanted);
            let sent = self.sent[stream.index()];
            let message = sent.wrapping_sub(sent.wrapping_sub(wanted) & WANTED_MESSAGE);
            // Only a message the successor has not consumed is still in its
            // slot and shadow; a request for another gets no write, and the
            // receiver's next read fails its checksum again.
            let consumed = transport.load(rank, stream.signals().1);
            let unconsumed = (message.wrapping_sub(consumed) as i32) > 0;
            let slot = self.slots[stream.index()]
                .iter()
                .position(|shadow| shadow.message == message);
            if let (true, Some(slot)) = (unconsumed, slot) {
                self.write(stream, slot, transport.window(rank, stream.window(slot)));
            }
            self.served.set(self.served.get().wrapping_add(1));
            transport.store(rank, Signal::Resent, self.served.get());
        }
    }
}

/// Whether the successor's request count `requests` asks for a resend
/// beyond the `served` ones. The successor asks for one message at a time
/// and waits until it is resent (`Checked::ask_resend`), so an honest count
/// is the served one or one more. Any other is no honest successor's, and
/// is left unserved: a hostile peer's, or this rank's own window read
/// through the module's stand-in page once its device went away, which
/// holds whatever this rank last wrote at that offset. Served as a count to
/// catch up with, such a number took up to 2^32 rounds of this loop (two
/// minutes of a rank spinning after its device was hot-unplugged, until
/// its next poll of the event stream named the removal).
fn request_pending(requests: u32, served: u32) -> bool {
    requests.wrapping_sub(served) == 1
}

#[cfg(test)]
mod tests {
    use super::request_pending;

    #[test]
    fn only_one_request_past_the_served_ones_is_served() {
        for served in [0, 1, 77, u32::MAX - 1, u32::MAX] {
            assert!(!request_pending(served, served), "none pending at {served}");
            assert!(
                request_pending(served.wrapping_add(1), served),
                "one at {served}"
            );
            for garbage in [2, 3, 1 << 16, 0x7fff_ffff, u32::MAX] {
                assert!(
                    !request_pending(served.wrapping_add(garbage), served),
                    "{garbage} ahead of {served}"
                );
            }
        }
    }
}
