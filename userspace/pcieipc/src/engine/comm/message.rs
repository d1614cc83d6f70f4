//! What every message between ranks looks like (pure): the two streams a
//! rank sends on, the stamp that starts each window, and how a stamp carries
//! its message's checksum.

use std::ptr::NonNull;

use crate::engine::checksum::CHECKSUM_BITS;
use crate::engine::failure::Carrier;
use crate::engine::transport::{Signal, Transport, Window};

/// Every Raw and Relay slot and one-shot window starts with its writer's call
/// number and call descriptor (four words; the chunk-size word also carries
/// the message's checksum where they are on), then the data: for small
/// messages stamp and data share a cache line, one transfer between cores.
pub(crate) const MESSAGE_HEADER_BYTES: usize = 32;

/// The stamp's chunk-size word: the chunk size in the low 32 bits, then the
/// checksum, then this flag (set when the message carries a checksum).
pub(crate) const STAMP_CHECKSUMMED: u64 = 1 << 63;
pub(crate) const CHECKSUM_MASK: u32 = (1 << CHECKSUM_BITS) - 1;
/// Message numbers travel in 31 bits of `ResendWanted`, the stream in bit 31.
pub(crate) const WANTED_MESSAGE: u32 = 0x7fff_ffff;

/// The two streams a rank sends to its successor and receives from its
/// predecessor: Raw carries the ring's first step, which may run ahead;
/// Relay every later step and broadcast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

    /// The stream a resend request names (bit 31 of `ResendWanted`).
    pub(crate) fn of_request(wanted: u32) -> Stream {
        if wanted >> 31 == 0 {
            Stream::Raw
        } else {
            Stream::Relay
        }
    }

    /// The `ResendWanted` word asking for `message` of this stream.
    pub(crate) fn request(self, message: u32) -> u32 {
        (self.index() as u32) << 31 | (message & WANTED_MESSAGE)
    }
}

/// The seed of the checksum of message `message` on `carrier`.
pub(crate) fn seed(carrier: Carrier, message: u32) -> u64 {
    (carrier as u64) << 32 | u64::from(message)
}

/// The checksum half of a stamp's chunk-size word, for `checksum`.
pub(crate) fn check_word(checksum: u32) -> u64 {
    STAMP_CHECKSUMMED | u64::from(checksum) << 32
}

/// Where a one-shot message of more than `ONE_SHOT_INLINE_BYTES` starts in
/// its window: at the next 128-byte pair of cache lines after the stamp's.
/// A reader polls the round word in the stamp's line; the adjacent-line
/// prefetcher fetches lines in 128-byte pairs, so data in the stamp's pair
/// was pulled to the reader while the writer was still filling it, and the
/// writer took it back: on the 2-vCPU Xeon a 64 B to 512 B call's median
/// was 15% slower with the data right after the stamp.
pub(crate) const ONE_SHOT_SPILLED_DATA: usize = 128;
/// One-shot messages up to this size share the stamp's cache line, and
/// arrive with the round word the reader polls.
const ONE_SHOT_INLINE_BYTES: usize = 64 - MESSAGE_HEADER_BYTES;

/// The data of a one-shot `window` holding a message of `bytes`.
pub(crate) fn one_shot_data_of<T>(window: *mut u8, bytes: usize) -> NonNull<T> {
    if bytes <= ONE_SHOT_INLINE_BYTES {
        return data_of(window);
    }
    // SAFETY: one-shot windows are page aligned and hold
    // ONE_SHOT_SPILLED_DATA bytes before a message at the budget (init).
    NonNull::new(unsafe { window.add(ONE_SHOT_SPILLED_DATA) }.cast::<T>())
        .expect("windows are never at address 0")
}

/// The data of `window` (past its stamp) as elements of `T`.
pub(crate) fn data_of<T>(window: *mut u8) -> NonNull<T> {
    // SAFETY: every window is page aligned and holds its stamp and then at
    // least a chunk (slots) or a one-shot message (one-shot windows), which
    // no reader's length exceeds.
    NonNull::new(unsafe { window.add(MESSAGE_HEADER_BYTES) }.cast::<T>())
        .expect("windows are never at address 0")
}

/// The chunk-size word of the stamp `peer` wrote on a window it published:
/// its checksum half.
pub(crate) fn stamp_check_word(transport: &Transport, peer: usize, window: Window) -> u64 {
    let start = transport.window(peer, window).cast::<u64>();
    // SAFETY: the peer wrote the stamp before publishing and leaves the
    // window alone until this rank is done with it; the word is the stamp's
    // fourth. Volatile: a damaged message's stamp is read again after its
    // resend.
    let word = unsafe { start.add(3).read_volatile() };
    word & !u64::from(u32::MAX)
}
