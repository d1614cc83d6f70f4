//! The receiving side of chunk checksums (docs/fault-path.md). Where a
//! transport's windows are device memory, every message crosses a PCIe link
//! twice (the sender's write, the receiver's read), and an uncorrectable
//! error on either may damage it without a trace in the data. So each
//! message carries a checksum of its data seeded with its number (the
//! sender's `Shadows`), and its receiver copies it to host memory and checks
//! it there before using a byte. A mismatch is read again (damage on the
//! receiving side), then asked for again from the sender, which writes its
//! shadow to the slot again (damage on the sending side). A message still
//! damaged after `RESENDS` fails every rank with `DamagedMessage`; one-shot
//! windows, which every peer reads, are read again but not resent.

use std::fmt;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::message::{
    check_word, data_of, one_shot_data_of, seed, stamp_check_word, Stream, CHECKSUM_MASK,
    STAMP_CHECKSUMMED,
};
use super::peers::Peers;
use super::shadows::{bytes_of, room};
use crate::engine::checksum::checksum;
use crate::engine::error::EngineError;
use crate::engine::failure::{Carrier, Corruption, Failure};
use crate::engine::transport::{Signal, Window};

/// How many times a receiver asks its predecessor to write a damaged message
/// again before it gives up.
const RESENDS: u32 = 3;

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

/// The checksum half of the stamp of a one-shot window holding `data` in
/// round `round`.
pub(crate) fn one_shot_check_word(round: u32, data: &[u8]) -> u64 {
    check_word(checksum(seed(Carrier::OneShotWindow, round), data))
}

/// A rank's checked copies of what it reads.
pub(crate) struct CheckedCopies {
    /// Per stream: where the message being read is copied and checked; one
    /// message per stream at a time (`held`).
    staging: [Vec<u64>; 2],
    held: [bool; 2],
    /// Per owner: the one-shot window of the current round, copied.
    one_shot: Vec<Vec<u64>>,
    /// Resends this rank has asked its predecessor for.
    requested: u32,
    resends: Vec<ResendRecord>,
}

impl CheckedCopies {
    pub(crate) fn new(nranks: usize) -> CheckedCopies {
        CheckedCopies {
            staging: [Vec::new(), Vec::new()],
            held: [false; 2],
            one_shot: vec![Vec::new(); nranks],
            requested: 0,
            resends: Vec::new(),
        }
    }

    pub(crate) fn resends(&self) -> &[ResendRecord] {
        &self.resends
    }

    /// The predecessor's message `message` on `stream`, `bytes` long in
    /// `window`, copied to host memory and checked (read again and resent
    /// while damaged).
    pub(crate) fn take_message(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
        window: Window,
        message: u32,
        bytes: usize,
    ) -> Result<NonNull<u8>, EngineError> {
        let index = stream.index();
        assert!(
            !self.held[index],
            "one message per stream is read at a time"
        );
        let predecessor = peers.predecessor();
        let data = self.take(peers, stream.carrier(), predecessor, window, message, bytes)?;
        self.held[index] = true;
        Ok(data)
    }

    /// The message of `stream` taken last is handed back.
    pub(crate) fn drop_message(&mut self, stream: Stream) {
        self.held[stream.index()] = false;
    }

    /// `owner`'s one-shot window of `parity` for round `round`, `bytes`
    /// long, copied and checked (read again once if damaged).
    pub(crate) fn take_one_shot(
        &mut self,
        peers: &mut Peers,
        owner: usize,
        parity: usize,
        round: u32,
        bytes: usize,
    ) -> Result<NonNull<u8>, EngineError> {
        let window = Window::OneShot { parity };
        self.take(peers, Carrier::OneShotWindow, owner, window, round, bytes)
    }

    /// `owner`'s one-shot copy taken by `take_one_shot`.
    pub(crate) fn one_shot_copy(&self, owner: usize) -> NonNull<u8> {
        NonNull::new(self.one_shot[owner].as_ptr().cast::<u8>().cast_mut())
            .expect("a Vec's pointer is never null")
    }

    fn take(
        &mut self,
        peers: &mut Peers,
        carrier: Carrier,
        peer: usize,
        window: Window,
        message: u32,
        bytes: usize,
    ) -> Result<NonNull<u8>, EngineError> {
        let started = Instant::now();
        let source = peers.transport.window(peer, window);
        let mut reads = 0;
        loop {
            reads += 1;
            let check_word = stamp_check_word(&peers.transport, peer, window);
            if check_word & STAMP_CHECKSUMMED == 0 {
                return Err(peers.blame(Failure::PeerCorrupt {
                    rank: peers.rank,
                    peer,
                    what: Corruption::ChecksumSetting,
                }));
            }
            let buffer = match carrier {
                Carrier::RawSlot => &mut self.staging[0],
                Carrier::RelaySlot => &mut self.staging[1],
                Carrier::OneShotWindow => &mut self.one_shot[peer],
            };
            let copy = room(buffer, bytes);
            let data = match carrier {
                Carrier::OneShotWindow => one_shot_data_of::<u8>(source, bytes),
                Carrier::RawSlot | Carrier::RelaySlot => data_of::<u8>(source),
            };
            // SAFETY: the peer published the window (its counter said so) and
            // leaves it alone until this rank is done with it; `copy` has
            // room for `bytes`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), copy.as_ptr(), bytes) };
            let sum = checksum(seed(carrier, message), bytes_of(buffer, bytes));
            if sum == (check_word >> 32) as u32 & CHECKSUM_MASK {
                if reads > 1 {
                    self.resends.push(ResendRecord {
                        call: peers.agreement.calls(),
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
                return Err(peers.blame(Failure::DamagedMessage {
                    rank: peers.rank,
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
                self.ask_resend(peers, stream, message)?;
            }
        }
    }

    /// Asks the predecessor to write `message` of `stream` again and waits
    /// until it has.
    fn ask_resend(
        &mut self,
        peers: &mut Peers,
        stream: Stream,
        message: u32,
    ) -> Result<(), EngineError> {
        let predecessor = peers.predecessor();
        let transport = &peers.transport;
        transport.store(predecessor, Signal::ResendWanted, stream.request(message));
        self.requested = self.requested.wrapping_add(1);
        transport.store(predecessor, Signal::ResendRequests, self.requested);
        // The predecessor may sleep on any counter (its own predecessor's, or
        // ours): wake it, wherever it sleeps.
        transport.wake_all();
        peers.wait_for(predecessor, predecessor, Signal::Resent, self.requested)
    }
}
