//! A mapping of a segment and the accessors of its control area.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::layout::{
    Counter, GlobalControl, Layout, RankControl, ABORT_NONE, ABORT_SET, ABORT_WRITING,
};
use crate::engine::call::CallDescriptor;
use crate::engine::failure::Failure;
use crate::engine::transport::{Signal, Window};

/// A mapping of the region, seen through its layout.
pub(crate) struct Segment {
    base: NonNull<u8>,
    layout: Layout,
}

impl Segment {
    /// # Safety
    ///
    /// `base` is page aligned and starts a shared mapping of at least
    /// `layout.total` bytes that outlives the `Segment`, whose control area is
    /// zeroed or written only through segments of the same layout.
    pub(crate) unsafe fn new(base: NonNull<u8>, layout: Layout) -> Segment {
        Segment { base, layout }
    }

    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    pub(crate) fn global(&self) -> &GlobalControl {
        // SAFETY: the control page is at the start of the mapping (page
        // aligned), zero-initialised atomics are valid, and the mapping
        // outlives `self`.
        unsafe { &*self.base.as_ptr().cast::<GlobalControl>() }
    }

    pub(crate) fn control(&self, rank: usize) -> &RankControl {
        assert!(rank < self.layout.nranks, "rank {rank} out of range");
        // SAFETY: `Layout` reserves nranks RankControl blocks at `controls`;
        // the mapping is page aligned and outlives `self`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(self.layout.controls)
                .cast::<RankControl>()
                .add(rank)
        }
    }

    pub(crate) fn counter(&self, owner: usize, signal: Signal) -> &Counter {
        &self.control(owner).counters[signal as usize]
    }

    /// The size of `window` in bytes.
    pub(crate) fn window_bytes(&self, window: Window) -> usize {
        let sizes = self.layout.sizes;
        match window {
            Window::Raw { .. } | Window::Relay { .. } => sizes.slot_bytes,
            Window::OneShot { .. } => sizes.one_shot_bytes,
            Window::Backend => sizes.backend_bytes,
        }
    }

    pub(crate) fn window(&self, owner: usize, window: Window) -> *mut u8 {
        let sizes = self.layout.sizes;
        let offset = match window {
            Window::Raw { slot } => {
                assert!(slot < sizes.raw_slots);
                slot * sizes.slot_bytes
            }
            Window::Relay { slot } => {
                assert!(slot < sizes.relay_slots);
                self.layout.relay + slot * sizes.slot_bytes
            }
            Window::OneShot { parity } => {
                assert!(parity < 2);
                self.layout.one_shot + parity * sizes.one_shot_bytes
            }
            Window::Backend => {
                assert!(sizes.backend_bytes > 0, "the segment has no backend area");
                self.layout.backend
            }
        };
        assert!(owner < self.layout.nranks);
        // SAFETY: `Layout` places every window of every rank inside the mapping.
        unsafe {
            self.base
                .as_ptr()
                .add(self.layout.windows + owner * self.layout.per_rank_windows + offset)
        }
    }

    pub(crate) fn set_blocked_on(&self, rank: usize, peer: Option<usize>) {
        let encoded = peer.map_or(0, |peer| peer as u32 + 1);
        self.control(rank)
            .status
            .blocked_on
            .store(encoded, Ordering::Release);
    }

    pub(crate) fn blocked_on(&self, rank: usize) -> Option<usize> {
        // A peer writes this word: a value no rank has is read as "running".
        match self.control(rank).status.blocked_on.load(Ordering::Acquire) {
            0 => None,
            encoded => Some(encoded as usize - 1).filter(|peer| *peer < self.layout.nranks),
        }
    }

    /// Marks `rank` departed; the caller then wakes the peers asleep on its
    /// counters.
    pub(crate) fn set_departed(&self, rank: usize) {
        // SeqCst, not just Release: pcieipc then reads the sleepers'
        // `sleeping_on`, and this store must not pass that load.
        self.control(rank)
            .status
            .departed
            .store(1, Ordering::SeqCst);
    }

    pub(crate) fn departed(&self, rank: usize) -> bool {
        self.control(rank).status.departed.load(Ordering::Acquire) != 0
    }

    /// Publishes `bdf` (`PCIEIPC_BDF` form) as the device `rank` maps the
    /// segment through.
    pub(crate) fn publish_device(&self, rank: usize, bdf: u32) {
        self.control(rank)
            .status
            .device
            .store(bdf.wrapping_add(1), Ordering::Release);
    }

    /// The rank that published device `bdf`, if one did.
    pub(crate) fn rank_of_device(&self, bdf: u32) -> Option<usize> {
        (0..self.layout().nranks).find(|&rank| {
            let published = self.control(rank).status.device.load(Ordering::Acquire);
            published != 0 && published.wrapping_sub(1) == bdf
        })
    }

    pub(crate) fn publish_call(&self, rank: usize, seq: u64, call: CallDescriptor) {
        // A seqlock: readers that see the sequence change under them discard
        // what they read.
        let entry = &self.control(rank).published[(seq % 2) as usize];
        entry.seq_plus_one.store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (word, value) in entry.words.iter().zip(call.to_words()) {
            word.store(value, Ordering::Relaxed);
        }
        entry.seq_plus_one.store(seq + 1, Ordering::Release);
    }

    pub(crate) fn published_call(&self, owner: usize, seq: u64) -> Option<CallDescriptor> {
        let entry = &self.control(owner).published[(seq % 2) as usize];
        if entry.seq_plus_one.load(Ordering::Acquire) != seq + 1 {
            return None;
        }
        let words = [0, 1, 2].map(|at| entry.words[at].load(Ordering::Relaxed));
        std::sync::atomic::fence(Ordering::Acquire);
        if entry.seq_plus_one.load(Ordering::Relaxed) != seq + 1 {
            return None;
        }
        CallDescriptor::from_words(words)
    }

    /// Records `failure` unless a failure is already recorded, runs `wake_all`
    /// (the transport wakes every sleeper), and returns the failure that
    /// stands.
    pub(crate) fn abort(&self, failure: Failure, wake_all: impl FnOnce()) -> Failure {
        let global = self.global();
        if global
            .abort_state
            .compare_exchange(
                ABORT_NONE,
                ABORT_WRITING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            for (word, value) in global.abort_words.iter().zip(failure.to_words()) {
                word.store(value, Ordering::Relaxed);
            }
            // SeqCst, not just Release: as in `set_departed`.
            global.abort_state.store(ABORT_SET, Ordering::SeqCst);
        }
        wake_all();
        // Another rank may be writing its record right now: it takes a few
        // stores, unless that rank died between them, which the bound covers.
        let give_up = std::time::Instant::now() + Duration::from_millis(100);
        while std::time::Instant::now() < give_up {
            if let Some(standing) = self.failure() {
                return standing;
            }
            std::hint::spin_loop();
        }
        failure
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        let global = self.global();
        if global.abort_state.load(Ordering::Acquire) != ABORT_SET {
            return None;
        }
        let words = std::array::from_fn(|at| global.abort_words[at].load(Ordering::Relaxed));
        Failure::from_words(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::chunk::{ChunkPolicy, LinkFacts};
    use crate::engine::transport::{WindowSizes, SIGNALS};

    /// A zeroed segment of `nranks` small windows in memory of its own,
    /// with its base and allocation (for the caller to free).
    fn zeroed_segment(nranks: usize) -> (Segment, NonNull<u8>, std::alloc::Layout) {
        let sizes = WindowSizes {
            slot_bytes: 4096,
            raw_slots: 1,
            relay_slots: 1,
            one_shot_bytes: 4096,
            backend_bytes: 0,
        };
        let layout = Layout::new(nranks, sizes).unwrap();
        let allocation = std::alloc::Layout::from_size_align(layout.total, 4096).unwrap();
        // SAFETY: a non-zero size and a valid alignment.
        let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(allocation) }).unwrap();
        // SAFETY: page aligned, `layout.total` bytes, freed by the caller
        // only after the last use of the segment; only the test writes it.
        let segment = unsafe { Segment::new(base, layout) };
        (segment, base, allocation)
    }

    #[test]
    fn a_published_device_names_its_rank_and_an_unpublished_one_none() {
        let (segment, base, allocation) = zeroed_segment(3);
        // Nothing published: a zeroed block is no device, not BDF 0.
        assert_eq!(segment.rank_of_device(0), None);
        segment.publish_device(0, 0x0100);
        segment.publish_device(2, 0x0500);
        assert_eq!(segment.rank_of_device(0x0100), Some(0));
        assert_eq!(segment.rank_of_device(0x0500), Some(2));
        assert_eq!(segment.rank_of_device(0x0400), None);
        assert_eq!(segment.rank_of_device(0), None);
        // SAFETY: allocated by `zeroed_segment` with this layout; unused now.
        unsafe { std::alloc::dealloc(base.as_ptr(), allocation) };
    }

    /// 10,000 control areas of random words, as a hostile peer may leave
    /// them: every accessor a rank reads a peer's state through returns a
    /// value in range or nothing, never panics.
    #[test]
    fn random_control_blocks_read_as_values_in_range() {
        let nranks = 3;
        let (segment, base, allocation) = zeroed_segment(nranks);
        let layout = segment.layout();
        let words = layout.windows / 8;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..10_000 {
            for at in 0..words {
                let value = match random() % 4 {
                    0 => 0,
                    1 => random() % 8,
                    _ => random(),
                };
                // SAFETY: inside the control area of the allocation above.
                unsafe { base.as_ptr().cast::<u64>().add(at).write_volatile(value) };
            }
            for rank in 0..nranks {
                if let Some(peer) = segment.blocked_on(rank) {
                    assert!(peer < nranks, "blocked on {peer}");
                }
                let _ = segment.departed(rank);
                if let Some(owner) = segment.rank_of_device(random() as u32) {
                    assert!(owner < nranks, "device of rank {owner}");
                }
                for seq in 0..4 {
                    let _ = segment.published_call(rank, seq);
                }
                let status = &segment.control(rank).status;
                let link = LinkFacts::from_word(status.link.load(Ordering::Relaxed));
                let _ = ChunkPolicy::default().chunk_bytes(link.as_ref(), 1 << 20);
                for signal in SIGNALS {
                    let _ = segment.counter(rank, signal).value.load(Ordering::Relaxed);
                }
            }
            let _ = segment.failure();
        }
        // SAFETY: allocated above with this layout; nothing refers to it now.
        unsafe { std::alloc::dealloc(base.as_ptr(), allocation) };
    }
}
