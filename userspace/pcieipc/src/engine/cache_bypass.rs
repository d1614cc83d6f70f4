//! Filling the ring's raw slots past the cache when the call's data does not
//! fit in it.
//!
//! The ring's first step copies the rank's input into raw slots up to
//! `in_flight` chunks ahead of its successor. When what the ranks' calls
//! touch together (every input, and every output when out of place) is larger
//! than the last-level cache, a filled slot is written back to memory before
//! the successor reads it, and a plain store has first read each line it
//! fills (a read for ownership): the line crosses the memory bus three
//! times. Non-temporal stores write it once, to memory, where the successor
//! finds it either way. When the data fits, the successor finds the chunk in
//! the cache, and plain stores are the faster. Measured on the 2-vCPU AMD
//! EPYC (32 MiB L3), 2 ranks (docs/engine.md): non-temporal slot fills were
//! 20–25% behind at 1–2 MiB messages, within the host's noise at 4–16 MiB,
//! and 3–40% ahead from 32 MiB up; the default threshold, a working set
//! the size of the last-level cache, takes them from 8 MiB out of place and
//! 16 MiB in place there.

use std::path::Path;

use super::dtype::Element;

/// When a rank fills its raw slots with non-temporal stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamingStores {
    /// From a working set the size of the host's last-level cache (as sysfs
    /// reports cpu0's), on transports whose windows are host memory; never
    /// where the windows are device memory (a BAR is not cached) or the
    /// host reports no cache. Below it, every slot's fill is plain or
    /// non-temporal as the calls measure (`slot_fill`).
    Auto,
    /// Never: plain stores whatever the size.
    Off,
    /// From a working set of this many bytes (0: always).
    From(usize),
}

impl StreamingStores {
    /// The working set in bytes from which slot fills bypass the cache
    /// (`usize::MAX`: never), for a transport whose windows are in device
    /// memory or not, on the host whose sysfs is at `sysfs_root`.
    pub(crate) fn working_set_threshold(self, device_memory: bool, sysfs_root: &Path) -> usize {
        match self {
            StreamingStores::Off => usize::MAX,
            StreamingStores::From(bytes) => bytes,
            StreamingStores::Auto if device_memory => usize::MAX,
            StreamingStores::Auto => last_level_cache_bytes(sysfs_root).unwrap_or(usize::MAX),
        }
    }
}

/// The size of cpu0's last-level data (or unified) cache, from sysfs under
/// `sysfs_root`: `None` where the host reports no cache there.
fn last_level_cache_bytes(sysfs_root: &Path) -> Option<usize> {
    let caches = sysfs_root.join("sys/devices/system/cpu/cpu0/cache");
    let read = |index: &Path, file: &str| std::fs::read_to_string(index.join(file)).ok();
    std::fs::read_dir(caches)
        .ok()?
        .filter_map(|entry| {
            let index = entry.ok()?.path();
            let level = read(&index, "level")?.trim().parse::<u32>().ok()?;
            let kind = read(&index, "type")?;
            let size = parse_cache_size(&read(&index, "size")?)?;
            matches!(kind.trim(), "Data" | "Unified").then_some((level, size))
        })
        .max()
        .map(|(_, size)| size)
}

/// A sysfs cache size ("32768K", "1M", "512"): bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 10),
        b'M' => (&text[..text.len() - 1], 20),
        b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// Copies `src` into `dst` (of the same length) with non-temporal stores
/// where the CPU has them (AVX2 here), plain ones elsewhere. The stores are
/// fenced before it returns, so a release store after it (the slot's post)
/// publishes them.
pub(crate) fn copy_bypassing_cache<T: Element>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "slot and chunk differ in length");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            let bytes = std::mem::size_of_val(src);
            // SAFETY: the CPU supports AVX2 (checked just above); `dst` and
            // `src` are `bytes` long each (asserted above) and cannot overlap,
            // one being borrowed mutably.
            unsafe {
                copy_streaming_avx2(dst.as_mut_ptr().cast(), src.as_ptr().cast(), bytes);
            }
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// # Safety
/// The CPU must support AVX2; `dst` and `src` must be valid for `bytes`
/// bytes of writes and reads, and must not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_streaming_avx2(dst: *mut u8, src: *const u8, bytes: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    const BLOCK: usize = 4 * std::mem::size_of::<__m256i>();
    // Plain stores up to the first 32-byte boundary of `dst` (the streaming
    // store's alignment), and for the tail under a whole block.
    let head = dst.align_offset(std::mem::size_of::<__m256i>()).min(bytes);
    // SAFETY: `head` ≤ `bytes`, within both ranges, which do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut done = head;
    while bytes - done >= BLOCK {
        // SAFETY: a whole block from `done` lies within both ranges;
        // `dst + done` is 32-byte aligned (from `head`, in steps of 128), and
        // the loads are unaligned ones.
        unsafe {
            let from = src.add(done).cast::<__m256i>();
            let to = dst.add(done).cast::<__m256i>();
            let (a, b) = (_mm256_loadu_si256(from), _mm256_loadu_si256(from.add(1)));
            let (c, d) = (
                _mm256_loadu_si256(from.add(2)),
                _mm256_loadu_si256(from.add(3)),
            );
            _mm256_stream_si256(to, a);
            _mm256_stream_si256(to.add(1), b);
            _mm256_stream_si256(to.add(2), c);
            _mm256_stream_si256(to.add(3), d);
        }
        done += BLOCK;
    }
    // SAFETY: the rest, `bytes - done`, lies within both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), bytes - done) };
    // Non-temporal stores are weakly ordered: without the fence, the post's
    // release store could become visible before them.
    _mm_sfence();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_exactly_at_every_alignment_and_length() {
        let source: Vec<u8> = (0..1200u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut target = vec![0u8; 1400];
        for offset in 0..40 {
            for len in [0, 1, 31, 32, 33, 127, 128, 129, 255, 256, 1000, 1100] {
                target.fill(0xEE);
                let from = (offset * 3) % 64;
                copy_bypassing_cache(&mut target[offset..offset + len], &source[from..from + len]);
                assert_eq!(&target[offset..offset + len], &source[from..from + len]);
                assert!(target[..offset].iter().all(|&byte| byte == 0xEE));
                assert!(target[offset + len..].iter().all(|&byte| byte == 0xEE));
            }
        }
        let floats: Vec<f64> = (0..513).map(|i| i as f64 * 0.5 - 3.0).collect();
        let mut copied = vec![0f64; 513];
        copy_bypassing_cache(&mut copied, &floats);
        assert_eq!(copied, floats);
    }

    #[test]
    fn sysfs_cache_sizes_parse() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("lots"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    /// A cpu0 cache tree under a scratch root, removed on drop.
    struct CacheTree(std::path::PathBuf);

    impl CacheTree {
        fn new(name: &str, indexes: &[(u32, &str, &str)]) -> CacheTree {
            let root =
                std::env::temp_dir().join(format!("pcieipc-cache-{name}-{}", std::process::id()));
            let caches = root.join("sys/devices/system/cpu/cpu0/cache");
            for (k, (level, kind, size)) in indexes.iter().enumerate() {
                let index = caches.join(format!("index{k}"));
                std::fs::create_dir_all(&index).unwrap();
                std::fs::write(index.join("level"), format!("{level}\n")).unwrap();
                std::fs::write(index.join("type"), format!("{kind}\n")).unwrap();
                std::fs::write(index.join("size"), format!("{size}\n")).unwrap();
            }
            std::fs::create_dir_all(&caches).unwrap();
            CacheTree(root)
        }
    }

    impl Drop for CacheTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_threshold_is_the_last_level_cache_in_host_memory_only() {
        let epyc = CacheTree::new(
            "epyc",
            &[
                (1, "Data", "32K"),
                (1, "Instruction", "32K"),
                (2, "Unified", "1024K"),
                (3, "Unified", "32768K"),
            ],
        );
        assert_eq!(last_level_cache_bytes(&epyc.0), Some(32 << 20));
        let auto = StreamingStores::Auto;
        assert_eq!(auto.working_set_threshold(false, &epyc.0), 32 << 20);
        assert_eq!(auto.working_set_threshold(true, &epyc.0), usize::MAX);
        assert_eq!(
            StreamingStores::From(0).working_set_threshold(true, &epyc.0),
            0
        );
        assert_eq!(
            StreamingStores::Off.working_set_threshold(false, &epyc.0),
            usize::MAX
        );
        // An instruction cache never counts, and no cache at all means never.
        let odd = CacheTree::new("odd", &[(1, "Data", "48K"), (2, "Instruction", "2M")]);
        assert_eq!(last_level_cache_bytes(&odd.0), Some(48 << 10));
        let none = CacheTree::new("none", &[]);
        assert_eq!(last_level_cache_bytes(&none.0), None);
        assert_eq!(auto.working_set_threshold(false, &none.0), usize::MAX);
    }
}
