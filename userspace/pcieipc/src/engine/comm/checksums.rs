//! Chunk checksums (docs/fault-path.md). Where a transport's windows are
//! device memory, every message crosses a PCIe link twice (the sender's write,
//! the receiver's read), and an uncorrectable error on either may damage it
//! without a trace in the data. So each message carries a checksum of its
//! data seeded with its number, and its receiver copies it to host memory and
//! checks it there before using a byte. A mismatch is read again (damage on the
//! receiving side), then asked for again: the sender keeps what it posted in a
//! host shadow until its successor has consumed it, and writes it to the slot
//! again (damage on the sending side). A message still damaged after
//! `RESENDS` fails every rank with `DamagedMessage`; one-shot windows, which
//! every peer reads, are read again but not resent.
//!
//! With `slots`, the only code of the communicator that touches shared windows
//! by pointer.

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::slots::{data_of, Stream};
use super::Communicator;
use crate::engine::checksum::{checksum, CHECKSUM_BITS};
use crate::engine::error::EngineError;
use crate::engine::failure::{Carrier, Corruption, Failure};
use crate::engine::transport::{Signal, Window};

/// The stamp's chunk-size word: the chunk size in the low 32 bits, then the
/// checksum, then this flag (set when the message carries a checksum).
pub(crate) const STAMP_CHECKSUMMED: u64 = 1 << 63;
const CHECKSUM_MASK: u32 = (1 << CHECKSUM_BITS) - 1;
/// How many times a receiver asks its predecessor to write a damaged message
/// again before it gives up.
const RESENDS: u32 = 3;
/// Message numbers travel in 31 bits of `ResendWanted`, the stream in bit 31.
const WANTED_MESSAGE: u32 = 0x7fff_ffff;

/// A fault injected for tests (`CommOptions::damage`): the sending rank flips
/// a byte of one chunk's data in the slot after checksumming it, as damage on
/// its side of the link would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamageInjection {
    /// Which chunk: the index among the chunks this rank posts on its two
    /// streams over the communicator's life, from 0.
    pub chunk: u64,
    /// How many writes of it to damage: the post and then its resends
    /// (more than `RESENDS` makes it stay damaged).
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

/// A message that arrived damaged and was read again until it was whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResendRecord {
    /// The call it belonged to.
    pub call: u64,
    pub peer: usize,
    pub carrier: Carrier,
    /// Its number on the carrier.
    pub message: u32,
    /// Reads it took: the first, a re-read, then one per resend.
    pub reads: u32,
    /// How long the rank spent on it before going on.
    pub stall: Duration,
}

impl fmt::Display for ResendRecord {
    /// `in call 25: message 37 of rank 0's relay slot failed its checksum;
    /// whole on read 3 (1 resend), stall 120 us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resends = self.reads.saturating_sub(2);
        write!(
            f,
            "in call {}: message {} of rank {}'s {} failed its checksum; whole on read {} \
             ({resends} resend{}), stall {} us",
            self.call,
            self.message,
            self.peer,
            self.carrier,
            self.reads,
            if resends == 1 { "" } else { "s" },
            self.stall.as_micros()
        )
    }
}

/// What a rank posted in one slot, kept until its successor consumed it.
#[derive(Default)]
struct Shadow {
    data: Vec<u64>,
    bytes: usize,
    message: u32,
    checksum: u32,
}

/// A rank's side of chunk checksums.
pub(crate) struct Checksums {
    /// Per stream (Raw, Relay), per slot.
    shadows: [Vec<Shadow>; 2],
    /// Per stream: where the message being read is copied and checked; one
    /// message per stream at a time (`held`).
    staging: [Vec<u64>; 2],
    held: [bool; 2],
    /// Per owner: the one-shot window of the current round, copied.
    one_shot: Vec<Vec<u64>>,
    /// Resends this rank has asked its predecessor for.
    requested: u32,
    /// Resends of its successor's requests this rank has made.
    served: Cell<u32>,
    posted_chunks: u64,
    damage: Option<DamageInjection>,
    /// The (stream, message) being damaged, and the writes of it still to damage.
    damaging: Cell<Option<(usize, u32, u32)>>,
    resends: Vec<ResendRecord>,
}

impl Checksums {
    pub(crate) fn new(
        nranks: usize,
        raw_slots: usize,
        relay_slots: usize,
        damage: Option<DamageInjection>,
    ) -> Checksums {
        let shadows = |slots: usize| (0..slots).map(|_| Shadow::default()).collect();
        Checksums {
            shadows: [shadows(raw_slots), shadows(relay_slots)],
            staging: [Vec::new(), Vec::new()],
            held: [false; 2],
            one_shot: vec![Vec::new(); nranks],
            requested: 0,
            served: Cell::new(0),
            posted_chunks: 0,
            damage,
            damaging: Cell::new(None),
            resends: Vec::new(),
        }
    }

    pub(crate) fn resends(&self) -> &[ResendRecord] {
        &self.resends
    }
}

/// `buffer` grown to hold `bytes`, as a pointer to its start.
fn room(buffer: &mut Vec<u64>, bytes: usize) -> NonNull<u8> {
    let words = bytes.div_ceil(8);
    if buffer.len() < words {
        buffer.resize(words, 0);
    }
    NonNull::new(buffer.as_mut_ptr().cast::<u8>()).expect("a Vec's pointer is never null")
}

fn bytes_of(buffer: &[u64], bytes: usize) -> &[u8] {
    // SAFETY: `room` grew the buffer to at least `bytes` bytes; u64s are
    // plain bytes.
    unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast::<u8>(), bytes) }
}

fn seed(carrier: Carrier, message: u32) -> u64 {
    (carrier as u64) << 32 | u64::from(message)
}

/// The checksum half of the stamp of a one-shot window holding `data` in
/// round `round`.
pub(crate) fn one_shot_check_word(round: u32, data: &[u8]) -> u64 {
    STAMP_CHECKSUMMED | u64::from(checksum(seed(Carrier::OneShotWindow, round), data)) << 32
}

impl Communicator {
    fn checks(&mut self) -> &mut Checksums {
        self.checksums
            .as_mut()
            .expect("only called with chunk checksums on")
    }

    /// Where this rank fills its next message on `stream` (slot `slot`):
    /// the slot's shadow, `bytes` long.
    pub(crate) fn shadow_slot(&mut self, stream: Stream, slot: usize, bytes: usize) -> NonNull<u8> {
        room(&mut self.checks().shadows[stream.index()][slot].data, bytes)
    }

    /// Checksums the shadow of `slot`, filled with message `message` of
    /// `bytes`, and writes it to the slot's window; returns the stamp's
    /// chunk-size word's checksum half.
    pub(crate) fn post_shadow(
        &mut self,
        stream: Stream,
        slot: usize,
        message: u32,
        bytes: usize,
    ) -> u64 {
        let window = self.transport.window(self.rank, stream.window(slot));
        let checks = self.checks();
        let shadow = &mut checks.shadows[stream.index()][slot];
        shadow.bytes = bytes;
        shadow.message = message;
        shadow.checksum = checksum(
            seed(stream.carrier(), message),
            bytes_of(&shadow.data, bytes),
        );
        let check_word = STAMP_CHECKSUMMED | u64::from(shadow.checksum) << 32;
        if checks
            .damage
            .is_some_and(|damage| damage.chunk == checks.posted_chunks)
        {
            let writes = checks.damage.map_or(0, |damage| damage.writes);
            checks.damaging.set(Some((stream.index(), message, writes)));
        }
        checks.posted_chunks += 1;
        self.write_shadow(stream, slot, window);
        check_word
    }

    /// Copies `slot`'s shadow into its window, damaged where a test asked.
    fn write_shadow(&self, stream: Stream, slot: usize, window: *mut u8) {
        let Some(checks) = &self.checksums else {
            return;
        };
        let shadow = &checks.shadows[stream.index()][slot];
        let data = data_of::<u8>(window).as_ptr();
        // SAFETY: the window is this rank's and holds a chunk past its stamp;
        // the successor reads it only after the posted (or `Resent`) store
        // that follows.
        unsafe {
            std::ptr::copy_nonoverlapping(shadow.data.as_ptr().cast::<u8>(), data, shadow.bytes)
        };
        if let Some((index, message, writes)) = checks.damaging.get() {
            if index == stream.index()
                && message == shadow.message
                && writes > 0
                && shadow.bytes > 0
            {
                // SAFETY: as above; the byte is inside the message.
                unsafe { *data.add(shadow.bytes / 2) ^= 0x5a };
                checks.damaging.set(Some((index, message, writes - 1)));
            }
        }
    }

    /// Writes again the messages the successor asked for (`Signal::ResendWanted`):
    /// at every step boundary and in every wait, so a rank blocked on anything
    /// still serves the peer that waits for it.
    pub(crate) fn serve_resends(&self) {
        let Some(checks) = &self.checksums else {
            return;
        };
        let requests = self.transport.load(self.rank, Signal::ResendRequests);
        while checks.served.get() != requests {
            let wanted = self.transport.load(self.rank, Signal::ResendWanted);
            let stream = if wanted >> 31 == 0 {
                Stream::Raw
            } else {
                Stream::Relay
            };
            let sent = self.sent(stream);
            let message = sent.wrapping_sub(sent.wrapping_sub(wanted) & WANTED_MESSAGE);
            let slots = self.slots(stream);
            // Only a message the successor has not consumed is still in its
            // slot and shadow; a request for another gets no write, and the
            // receiver's next read fails its checksum again.
            let consumed = self.transport.load(self.rank, stream.signals().1);
            let slot = self.sent_slot(stream, message.wrapping_sub(1));
            let unconsumed =
                (message.wrapping_sub(consumed) as i32) > 0 && sent.wrapping_sub(message) < slots;
            if unconsumed && checks.shadows[stream.index()][slot].message == message {
                let window = self.transport.window(self.rank, stream.window(slot));
                self.write_shadow(stream, slot, window);
            }
            checks.served.set(checks.served.get().wrapping_add(1));
            self.transport
                .store(self.rank, Signal::Resent, checks.served.get());
        }
    }

    /// The predecessor's message `message` on `stream`, `bytes` long in
    /// `window`, copied to host memory and checked (read again and resent
    /// while damaged).
    pub(crate) fn take_message(
        &mut self,
        stream: Stream,
        window: Window,
        message: u32,
        bytes: usize,
    ) -> Result<NonNull<u8>, EngineError> {
        let index = stream.index();
        assert!(
            !self.checks().held[index],
            "one message per stream is read at a time"
        );
        let data =
            self.take_checked(stream.carrier(), self.predecessor(), window, message, bytes)?;
        self.checks().held[index] = true;
        Ok(data)
    }

    /// The message of `stream` taken last is handed back.
    pub(crate) fn drop_message(&mut self, stream: Stream) {
        if let Some(checks) = &mut self.checksums {
            checks.held[stream.index()] = false;
        }
    }

    /// `owner`'s one-shot window of `parity` for round `round`, `bytes`
    /// long, copied and checked (read again once if damaged).
    pub(crate) fn take_one_shot(
        &mut self,
        owner: usize,
        parity: usize,
        round: u32,
        bytes: usize,
    ) -> Result<NonNull<u8>, EngineError> {
        self.take_checked(
            Carrier::OneShotWindow,
            owner,
            Window::OneShot { parity },
            round,
            bytes,
        )
    }

    /// `owner`'s one-shot copy taken by `take_one_shot`.
    pub(crate) fn one_shot_copy(&self, owner: usize) -> Option<NonNull<u8>> {
        let checks = self.checksums.as_ref()?;
        NonNull::new(checks.one_shot[owner].as_ptr().cast::<u8>().cast_mut())
    }

    fn take_checked(
        &mut self,
        carrier: Carrier,
        peer: usize,
        window: Window,
        message: u32,
        bytes: usize,
    ) -> Result<NonNull<u8>, EngineError> {
        let started = Instant::now();
        let source = self.transport.window(peer, window);
        let mut reads = 0;
        loop {
            reads += 1;
            let check_word = self.stamp_check_word(peer, window);
            if check_word & STAMP_CHECKSUMMED == 0 {
                return Err(self.blame_peer(Failure::PeerCorrupt {
                    rank: self.rank,
                    peer,
                    what: Corruption::ChecksumSetting,
                }));
            }
            let checks = self.checks();
            let buffer = match carrier {
                Carrier::RawSlot => &mut checks.staging[0],
                Carrier::RelaySlot => &mut checks.staging[1],
                Carrier::OneShotWindow => &mut checks.one_shot[peer],
            };
            let copy = room(buffer, bytes);
            // SAFETY: the peer published the window (its counter said so) and
            // leaves it alone until this rank is done with it; `copy` has
            // room for `bytes`.
            unsafe {
                std::ptr::copy_nonoverlapping(data_of::<u8>(source).as_ptr(), copy.as_ptr(), bytes)
            };
            let sum = checksum(seed(carrier, message), bytes_of(buffer, bytes));
            if sum == (check_word >> 32) as u32 & CHECKSUM_MASK {
                if reads > 1 {
                    let call = self.calls;
                    self.checks().resends.push(ResendRecord {
                        call,
                        peer,
                        carrier,
                        message,
                        reads,
                        stall: started.elapsed(),
                    });
                }
                return Ok(copy);
            }
            let resend = match carrier {
                Carrier::OneShotWindow => reads < 2,
                Carrier::RawSlot | Carrier::RelaySlot => reads < 2 + RESENDS,
            };
            if !resend {
                return Err(self.blame_peer(Failure::DamagedMessage {
                    rank: self.rank,
                    peer,
                    carrier,
                    message,
                    reads,
                }));
            }
            if reads >= 2 {
                let stream = match carrier {
                    Carrier::RawSlot => Stream::Raw,
                    _ => Stream::Relay,
                };
                self.ask_resend(stream, message)?;
            }
        }
    }

    /// Asks the predecessor to write `message` of `stream` again and waits
    /// until it has.
    fn ask_resend(&mut self, stream: Stream, message: u32) -> Result<(), EngineError> {
        let predecessor = self.predecessor();
        let wanted = (stream.index() as u32) << 31 | (message & WANTED_MESSAGE);
        self.transport
            .store(predecessor, Signal::ResendWanted, wanted);
        let requested = {
            let checks = self.checks();
            checks.requested = checks.requested.wrapping_add(1);
            checks.requested
        };
        self.transport
            .store(predecessor, Signal::ResendRequests, requested);
        // The predecessor may sleep on any counter (its own predecessor's, or
        // ours): wake it, wherever it sleeps.
        self.transport.wake_all();
        self.wait_for(predecessor, predecessor, Signal::Resent, requested)
    }

    /// Waits until the successor has consumed every message this rank sent,
    /// serving its resends meanwhile: a call ends only when nothing it sent can
    /// still be asked for again.
    pub(crate) fn drain_streams(&mut self) -> Result<(), EngineError> {
        if self.checksums.is_none() || self.nranks == 1 {
            return Ok(());
        }
        for stream in [Stream::Raw, Stream::Relay] {
            let sent = self.sent(stream);
            self.wait_for(self.successor(), self.rank, stream.signals().1, sent)?;
        }
        Ok(())
    }
}
