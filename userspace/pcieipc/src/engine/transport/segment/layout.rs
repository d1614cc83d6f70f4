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
    /// `PCIEIPC_BDF` + 1 of the device this rank maps the segment through
    /// (0: none), written with `peer_id`: a rank that sees a device lost in
    /// the module's events learns whose it was here, since that rank's own
    /// writes went with its device.
    pub(crate) device: AtomicU32,
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
    pub(crate) backend: usize,
    pub(crate) total: usize,
}

pub(crate) fn round_up(bytes: usize, to: usize) -> usize {
    bytes.div_ceil(to) * to
}

/// Bounds on the window sizes a rank accepts, its own or rank 0's (from
/// the welcome): far above any real use, and low enough that no layout
/// arithmetic can overflow.
const MAX_RANKS: usize = 1 << 12;
const MAX_WINDOW_BYTES: usize = 1 << 30;
const MAX_SLOTS: usize = 1 << 16;
const MAX_SEGMENT_BYTES: usize = 1 << 40;

impl Layout {
    /// The layout of `nranks` ranks' windows of `sizes`, or why no segment
    /// can have them: every size page aligned and within the bounds above,
    /// at least one slot of each stream, all arithmetic checked.
    pub(crate) fn new(nranks: usize, sizes: WindowSizes) -> Result<Layout, String> {
        if !(1..=MAX_RANKS).contains(&nranks) {
            return Err(format!("{nranks} ranks (1 to {MAX_RANKS})"));
        }
        for (what, bytes) in [
            ("slot", sizes.slot_bytes),
            ("one-shot window", sizes.one_shot_bytes),
        ] {
            if !(PAGE..=MAX_WINDOW_BYTES).contains(&bytes) || bytes % PAGE != 0 {
                return Err(format!(
                    "{what} of {bytes} bytes (a multiple of {PAGE} up to {MAX_WINDOW_BYTES})"
                ));
            }
        }
        if sizes.backend_bytes > MAX_WINDOW_BYTES || !sizes.backend_bytes.is_multiple_of(PAGE) {
            return Err(format!(
                "backend area of {} bytes (a multiple of {PAGE} up to {MAX_WINDOW_BYTES})",
                sizes.backend_bytes
            ));
        }
        for (what, slots) in [("raw", sizes.raw_slots), ("relay", sizes.relay_slots)] {
            if !(1..=MAX_SLOTS).contains(&slots) {
                return Err(format!("{slots} {what} slots (1 to {MAX_SLOTS})"));
            }
        }
        let overflow = || format!("the windows of {nranks} ranks exceed {MAX_SEGMENT_BYTES} bytes");
        let controls = round_up(std::mem::size_of::<GlobalControl>(), PAGE);
        let windows = controls + round_up(nranks * std::mem::size_of::<RankControl>(), PAGE);
        let relay = sizes.raw_slots * sizes.slot_bytes;
        let one_shot = relay + sizes.relay_slots * sizes.slot_bytes;
        let backend = round_up(one_shot + 2 * sizes.one_shot_bytes, PAGE);
        let per_rank_windows = backend + sizes.backend_bytes;
        let total = nranks
            .checked_mul(per_rank_windows)
            .and_then(|all| all.checked_add(windows))
            .filter(|total| *total <= MAX_SEGMENT_BYTES)
            .ok_or_else(overflow)?;
        Ok(Layout {
            nranks,
            sizes,
            controls,
            windows,
            per_rank_windows,
            relay,
            one_shot,
            backend,
            total,
        })
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
            backend_bytes: 3 * PAGE,
        };
        let layout = Layout::new(4, sizes).unwrap();
        assert_eq!(layout.controls, PAGE);
        assert!(layout.controls + 4 * std::mem::size_of::<RankControl>() <= layout.windows);
        assert_eq!(layout.backend, (5 + 25 + 2) * 8192);
        assert_eq!(layout.per_rank_windows, (5 + 25 + 2) * 8192 + 3 * PAGE);
        assert_eq!(
            layout.total,
            layout.windows + 4 * ((5 + 25 + 2) * 8192 + 3 * PAGE)
        );
    }

    #[test]
    fn sizes_out_of_bounds_are_refused_not_wrapped() {
        let good = WindowSizes {
            slot_bytes: PAGE,
            raw_slots: 1,
            relay_slots: 1,
            one_shot_bytes: PAGE,
            backend_bytes: 0,
        };
        assert!(Layout::new(2, good).is_ok());
        let bad = [
            (0, good),
            (MAX_RANKS + 1, good),
            (
                2,
                WindowSizes {
                    raw_slots: 0,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    relay_slots: usize::MAX,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    slot_bytes: 0,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    slot_bytes: PAGE + 1,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    slot_bytes: usize::MAX - PAGE + 1,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    one_shot_bytes: 2 * MAX_WINDOW_BYTES,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    backend_bytes: PAGE / 2,
                    ..good
                },
            ),
            (
                2,
                WindowSizes {
                    backend_bytes: 2 * MAX_WINDOW_BYTES,
                    ..good
                },
            ),
            (
                MAX_RANKS,
                WindowSizes {
                    slot_bytes: MAX_WINDOW_BYTES,
                    raw_slots: MAX_SLOTS,
                    ..good
                },
            ),
        ];
        for (nranks, sizes) in bad {
            assert!(
                Layout::new(nranks, sizes).is_err(),
                "{nranks} ranks, {sizes:?}"
            );
        }
    }
}
