//! Where everything lives in a segment: a control page, a control block
//! per rank, then per rank its windows.

use std::sync::atomic::{AtomicU32, AtomicU64};

use super::super::{WindowSizes, SIGNALS};
use crate::engine::failure::FAILURE_WORDS;

pub(crate) const PAGE: usize = 4096;

#[repr(C, align(64))]
pub(crate) struct Counter {
    pub(crate) value: AtomicU32,
    /// Ranks asleep on `value` in a futex wait (shm), so that a store pays
    /// the wake syscall only when someone sleeps.
    pub(crate) waiters: AtomicU32,
}

#[repr(C, align(64))]
pub(crate) struct PublishedCall {
    /// seq + 1 of the call described, 0 while none: written after the words.
    pub(crate) seq_plus_one: AtomicU64,
    pub(crate) words: [AtomicU64; 3],
}

#[repr(C, align(64))]
pub(crate) struct RankStatus {
    /// rank + 1 of the peer this rank is blocked on, 0 while running.
    pub(crate) blocked_on: AtomicU32,
    pub(crate) departed: AtomicU32,
    /// pcieipc: `sleep_code` of the counter this rank sleeps on, 0 while
    /// awake: a store rings the doorbell of exactly the ranks asleep on its
    /// counter.
    pub(crate) sleeping_on: AtomicU32,
    /// pcieipc: peer id + 1 of this rank's device, written before it first
    /// sleeps.
    pub(crate) peer_id: AtomicU32,
    /// `LinkFacts::to_word` of the link under this rank's ring hop.
    pub(crate) link: AtomicU64,
    /// shm: the address of this very word in this rank's process, written
    /// by the rank itself; a peer reads it back with `process_vm_readv` to
    /// prove it may read this rank's memory (the single-copy all-gather).
    pub(crate) probe: AtomicU64,
    /// shm: the message sizes (first, last) for which the ring's all-gather
    /// reads finished chunks straight from the predecessor, then those
    /// (first, last) that go direct, written before `probe`.
    pub(crate) single_copy_messages: [AtomicU64; 4],
}

#[repr(C)]
pub(crate) struct RankControl {
    pub(crate) counters: [Counter; SIGNALS.len()],
    pub(crate) status: RankStatus,
    /// Indexed by call parity. A rank waiting on a peer in the one-shot path
    /// finds the peer at most one call ahead; elsewhere (a broadcast chain) a
    /// peer may run further ahead and reuse the entry, which readers detect
    /// and then ignore: messages carry their own call stamp for that case.
    pub(crate) published: [PublishedCall; 2],
}

pub(crate) const ABORT_NONE: u32 = 0;
pub(crate) const ABORT_WRITING: u32 = 1;
pub(crate) const ABORT_SET: u32 = 2;

#[repr(C, align(64))]
pub(crate) struct GlobalControl {
    /// pcieipc: the job's tag, written by rank 0 once the control blocks are
    /// zeroed: the other ranks check it to prove their BAR2 is the same region.
    pub(crate) job_tag: AtomicU64,
    pub(crate) abort_state: AtomicU32,
    pub(crate) abort_words: [AtomicU64; FAILURE_WORDS],
}

/// Where everything lives in the region; a pure function of the rank count
/// and window sizes, so every rank computes the same offsets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) nranks: usize,
    pub(crate) sizes: WindowSizes,
    pub(crate) controls: usize,
    /// Where the windows start: everything before is the control area.
    pub(crate) windows: usize,
    pub(crate) per_rank_windows: usize,
    pub(crate) relay: usize,
    pub(crate) one_shot: usize,
    pub(crate) total: usize,
}

pub(crate) fn round_up(bytes: usize, to: usize) -> usize {
    bytes.div_ceil(to) * to
}

impl Layout {
    pub(crate) fn new(nranks: usize, sizes: WindowSizes) -> Layout {
        let controls = round_up(std::mem::size_of::<GlobalControl>(), PAGE);
        let windows = controls + round_up(nranks * std::mem::size_of::<RankControl>(), PAGE);
        let relay = sizes.raw_slots * sizes.slot_bytes;
        let one_shot = relay + sizes.relay_slots * sizes.slot_bytes;
        let per_rank_windows = round_up(one_shot + 2 * sizes.one_shot_bytes, PAGE);
        Layout {
            nranks,
            sizes,
            controls,
            windows,
            per_rank_windows,
            relay,
            one_shot,
            total: windows + nranks * per_rank_windows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_windows_after_the_control_blocks() {
        let sizes = WindowSizes {
            slot_bytes: 8192,
            raw_slots: 5,
            relay_slots: 25,
            one_shot_bytes: 8192,
        };
        let layout = Layout::new(4, sizes);
        assert_eq!(layout.controls, PAGE);
        assert!(layout.controls + 4 * std::mem::size_of::<RankControl>() <= layout.windows);
        assert_eq!(layout.per_rank_windows, (5 + 25 + 2) * 8192);
        assert_eq!(layout.total, layout.windows + 4 * (5 + 25 + 2) * 8192);
    }
}
