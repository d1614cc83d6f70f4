//! Append-only storage for what a rank records, in chunks whose pages are
//! faulted in when the chunk is made, not when an event first lands on
//! them. A trace kept in a growing `Vec` took a page fault every few tens
//! of calls (and copied everything at each doubling), adding microseconds
//! to the very calls whose tail it was recording; here a chunk's cost is
//! paid at once, where the caller can record it as an event of its own.

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nix::sys::mman::{madvise, MmapAdvise};

/// Pages are touched one byte each: that faults them in (a private page
/// for the process) without writing the whole chunk.
const PAGE_BYTES: usize = 4096;

pub(crate) struct Prefaulted<T> {
    /// Chunks filled, oldest first.
    full: Vec<Vec<T>>,
    /// The chunk being filled: its capacity is touched, `len` grows.
    current: Vec<T>,
}

impl<T> Prefaulted<T> {
    /// Storage whose first chunk holds `chunk_len` values, as every later
    /// one does.
    pub(crate) fn new(chunk_len: usize) -> Prefaulted<T> {
        Prefaulted {
            full: Vec::new(),
            current: touched_chunk(chunk_len.max(1)),
        }
    }

    /// Appends `value`; returns how long making a new chunk took where the
    /// current one was full (`None`: it had room).
    pub(crate) fn push(&mut self, value: T) -> Option<Duration> {
        let grown = (self.current.len() == self.current.capacity()).then(|| {
            let started = Instant::now();
            let next = touched_chunk(self.current.capacity());
            self.full.push(std::mem::replace(&mut self.current, next));
            started.elapsed()
        });
        self.current.push(value);
        grown
    }

    /// Every value, in the order pushed.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.full.iter().flatten().chain(&self.current)
    }

    /// How many chunks hold values (the current one included).
    #[cfg(test)]
    fn chunks(&self) -> usize {
        self.full.len() + 1
    }
}

/// An empty `Vec` with room for `len` values, every page of that room
/// already faulted in: populated in one call (MADV_POPULATE_WRITE, Linux
/// 5.14; 1.9 ms for 8 MiB on the 2-vCPU VM, against 2.9 ms page by page),
/// then touched page by page, which faults in what that did not (older
/// kernels, the range's partial edge pages) and costs nothing where it
/// did. Not as transparent huge pages: those took 0.9 ms most times but
/// 13-24 ms where the kernel compacted memory to find them.
fn touched_chunk<T>(len: usize) -> Vec<T> {
    let mut chunk = Vec::with_capacity(len);
    let room = chunk.spare_capacity_mut();
    let bytes = std::mem::size_of_val(room);
    let base = room.as_mut_ptr().cast::<u8>();
    let first_page = (base as usize).next_multiple_of(PAGE_BYTES);
    let end_page = (base as usize + bytes) / PAGE_BYTES * PAGE_BYTES;
    if let Some(start) = NonNull::new(first_page as *mut std::ffi::c_void) {
        if end_page > first_page {
            // SAFETY: whole pages inside the allocation just made, which
            // nothing else uses yet; populating changes no byte of it. A
            // refusal (an older kernel) leaves the pages to the touch below.
            let _ = unsafe {
                madvise(
                    start,
                    end_page - first_page,
                    MmapAdvise::MADV_POPULATE_WRITE,
                )
            };
        }
    }
    for offset in (0..bytes).step_by(PAGE_BYTES) {
        // SAFETY: `offset` is inside the spare capacity just allocated,
        // which holds uninitialised `T`s that any byte may be written into;
        // `len` stays 0, so nothing reads them as `T`. Volatile, so that
        // the touch is not elided as a store nothing reads.
        unsafe { base.add(offset).write_volatile(0) };
    }
    chunk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_back_in_order_across_chunks() {
        let mut storage = Prefaulted::new(3);
        let grew: Vec<bool> = (0..10u64)
            .map(|value| storage.push(value).is_some())
            .collect();
        // A new chunk at the 4th, 7th and 10th value.
        assert_eq!(
            grew,
            [false, false, false, true, false, false, true, false, false, true]
        );
        assert_eq!(storage.chunks(), 4);
        assert_eq!(
            storage.iter().copied().collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
    }

    /// Pushing into a chunk takes no page fault: its pages were touched
    /// when it was made (this thread's minor faults, getrusage).
    #[test]
    fn filling_a_chunk_takes_no_page_fault() {
        let faults = || {
            nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
                .unwrap()
                .minor_page_faults()
        };
        // 64 MiB of 64-byte values: 16384 pages (32 huge ones) to fault in,
        // fresh from mmap (glibc serves no request past 32 MiB from memory
        // another test freed, which could already be faulted in).
        let len = (64 << 20) / 64;
        let before = faults();
        let mut storage = Prefaulted::<[u64; 8]>::new(len);
        let made = faults() - before;
        let before = faults();
        for value in 0..len as u64 {
            assert!(storage.push([value; 8]).is_none());
        }
        let filling = faults() - before;
        assert!(made >= 32, "making the chunk faulted {made} pages in");
        assert!(
            filling < 16,
            "filling 16384 touched pages faulted {filling} (making it: {made})"
        );
    }
}
