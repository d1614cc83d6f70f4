//! Random ioctls and mmaps on /dev/pcieipc: only errnos may come back (the
//! harness fails the run on any kernel WARNING/BUG/Oops in the guest log).

use std::{collections::BTreeMap, num::NonZeroUsize, os::fd::AsRawFd};

use nix::{
    errno::Errno,
    sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags},
};
use pcieipc_uapi as uapi;

use super::common::{CheckResult, Rng};

const SCRATCH: usize = 8192;

/// The errnos the module's contract allows for any input (docs/abi.md).
const ALLOWED: &[Errno] = &[
    Errno::EBUSY,
    Errno::ENOSPC,
    Errno::ENOTTY,
    Errno::EINVAL,
    Errno::EFAULT,
    Errno::ENOENT,
    Errno::ENODEV,
    Errno::EIO,
    Errno::ETIMEDOUT,
    Errno::EOPNOTSUPP,
    Errno::EPERM,
    Errno::EINTR,
    Errno::ENOMEM,
];

/// Picks a pointer for the kernel to read or write: NULL, an unmapped page,
/// a kernel address, or `buffer` (at least SCRATCH bytes: more than any
/// ioctl writes, so a random argument never corrupts this process).
fn pointer(rng: &mut Rng, buffer: *mut u8, unmapped: usize) -> u64 {
    match rng.below(5) {
        0 => 0,
        1 => unmapped as u64,
        2 => 0xffff_8880_0000_0000 + rng.below(1 << 20),
        _ => buffer as u64,
    }
}

/// Fills the scratch buffer with a random argument: random bytes, a random
/// or plausible argsz, plausible device indices and vectors, pointers of
/// every kind, and timeouts short enough that nothing blocks for long.
fn random_argument(
    rng: &mut Rng,
    scratch: &mut [u8],
    entries: *mut u8,
    cmd_nr: u32,
    unmapped: usize,
) {
    for byte in scratch.iter_mut() {
        *byte = rng.next() as u8;
    }
    let word = |s: &mut [u8], at: usize, v: u32| s[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let argsz = match rng.below(4) {
        0 => rng.next() as u32,
        1 => rng.below(64) as u32,
        _ => [48, 32, 40, 272, 16, 56, 24][rng.below(7) as usize],
    };
    word(scratch, 0, argsz);
    if rng.below(2) == 0 {
        word(scratch, 4, 0); // flags
    }
    if rng.below(2) == 0 {
        word(scratch, 8, rng.below(8) as u32); // device index (LIST: entry_size)
    }
    if rng.below(2) == 0 {
        word(scratch, 12, rng.below(40) as u32); // vector / capacity / peer+vector
    }
    if cmd_nr == uapi::PCIEIPC_CMD_LIST {
        // At most 8 entries of at most 256 bytes: within the entries buffer.
        word(scratch, 8, rng.below(257) as u32);
        word(scratch, 12, rng.below(9) as u32);
        let ptr = pointer(rng, entries, unmapped);
        scratch[24..32].copy_from_slice(&ptr.to_le_bytes());
    }
    if cmd_nr == uapi::PCIEIPC_CMD_WAIT {
        // A short timeout: never PCIEIPC_WAIT_FOREVER.
        word(scratch, 24, rng.below(3) as u32);
    }
    if cmd_nr == uapi::PCIEIPC_CMD_DMA_ALLOC {
        // Small buffers: a failed large allocation would log a (harmless)
        // page-allocation warning, which the harness counts as a failure.
        let size = rng.below(64 << 10);
        scratch[16..24].copy_from_slice(&size.to_le_bytes());
    }
    if cmd_nr == uapi::PCIEIPC_CMD_DMA_WAIT {
        word(scratch, 16, rng.below(3) as u32);
    }
}

/// `fuzz`: `iterations` random ioctls and `iterations / 10` random mmaps.
pub fn run(iterations: u64, seed: u64) -> CheckResult {
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pcieipc::device::DEFAULT_PATH)
        .map_err(|e| e.to_string())?;
    let fd = device.as_raw_fd();
    let mut rng = Rng::new(seed);
    let mut scratch = vec![0u8; SCRATCH];
    let mut entries = vec![0u8; SCRATCH];
    let page = NonZeroUsize::new(4096).ok_or("page")?;
    // An address with nothing mapped: a page mapped and then unmapped.
    // SAFETY: a fresh anonymous mapping, unmapped at once; never accessed.
    let unmapped = unsafe {
        let p = mmap_anonymous(None, page, ProtFlags::PROT_READ, MapFlags::MAP_PRIVATE)
            .map_err(|e| e.to_string())?;
        munmap(p, page.get()).map_err(|e| e.to_string())?;
        p.as_ptr() as usize
    };
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..iterations {
        let cmd_nr = match rng.below(4) {
            0 => rng.next() as u32 & 0xff,
            _ => rng.below(8) as u32,
        };
        let request = match rng.below(10) {
            0 => rng.next() as u32,
            _ => (uapi::PCIEIPC_IOC_MAGIC << 8) | cmd_nr,
        };
        random_argument(
            &mut rng,
            &mut scratch,
            entries.as_mut_ptr(),
            cmd_nr,
            unmapped,
        );
        let arg = pointer(&mut rng, scratch.as_mut_ptr(), unmapped);
        // SAFETY: the kernel writes at most into the scratch and entries
        // buffers (which outlive the call, and are larger than any write) or
        // faults on the other pointers (EFAULT); no Rust reference to them
        // is live across the call.
        let ret = unsafe { nix::libc::ioctl(fd, request as _, arg) };
        let answer = if ret >= 0 {
            "ok".to_string()
        } else {
            let errno = Errno::last();
            if !ALLOWED.contains(&errno) {
                return Err(format!("ioctl {request:#x} arg {arg:#x} gave {errno}"));
            }
            format!("{errno:?}")
        };
        // Per pcieipc command, so that the summary shows each one exercised.
        let outcome = if request >> 8 == uapi::PCIEIPC_IOC_MAGIC && cmd_nr < 8 {
            format!("nr{cmd_nr} {answer}")
        } else {
            format!("other {answer}")
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    let mut mapped = 0;
    for _ in 0..iterations / 10 {
        let offset = match rng.below(3) {
            0 => rng.next() & !0xfff & (i64::MAX as u64),
            1 => uapi::mmap_offset(rng.below(8) as u32, rng.below(16) as u32),
            _ => uapi::mmap_offset(rng.below(8) as u32, 2) + (rng.below(512) << 12),
        };
        let len = NonZeroUsize::new(((rng.below(300) + 1) << 12) as usize).ok_or("len")?;
        // SAFETY: a new shared mapping at an address the kernel picks.
        let result = unsafe {
            nix::sys::mman::mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &device,
                offset as i64,
            )
        };
        match result {
            Ok(ptr) => {
                mapped += 1;
                // SAFETY: the mapping just made, not referenced elsewhere.
                unsafe { munmap(ptr, len.get()) }.map_err(|e| e.to_string())?;
            }
            Err(errno) if ALLOWED.contains(&errno) => {}
            Err(errno) => return Err(format!("mmap offset {offset:#x} len {len}: {errno}")),
        }
    }
    let dma_outcomes = dma_phase(&mut rng, iterations / 20)?;
    println!("fuzz: {iterations} random ioctls (seed {seed}): {outcomes:?}");
    println!(
        "fuzz: {} plausible DMA copies and waits: {dma_outcomes:?}",
        iterations / 20
    );
    println!(
        "fuzz: {} random mmaps, {mapped} mapped and unmapped",
        iterations / 10
    );
    Ok(())
}

/// Plausible DMA requests: real buffers of the bound devices, random offsets,
/// lengths (small: edu takes 200 ms per 4 KiB), BAR flags and BAR numbers,
/// and short ticket waits; the file is closed with copies possibly still
/// running on edu (the copy holds its buffers).
fn dma_phase(rng: &mut Rng, copies: u64) -> Result<BTreeMap<String, u64>, String> {
    let device =
        pcieipc::device::Device::open(pcieipc::device::DEFAULT_PATH).map_err(|e| e.to_string())?;
    let devices: Vec<u32> = device
        .list()
        .map_err(|e| e.to_string())?
        .iter()
        .filter(|d| d.state == pcieipc::device::DeviceState::Bound)
        .map(|d| d.index)
        .collect();
    let mut buffers = Vec::new();
    for &index in &devices {
        for _ in 0..2 {
            let size = rng.below(16 << 10) + 1;
            buffers.push(device.dma_alloc(index, size).map_err(|e| e.to_string())?);
        }
    }
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut note = |what: &str, result: Result<(), Errno>| -> Result<(), String> {
        let key = match result {
            Ok(()) => format!("{what} ok"),
            Err(errno) if ALLOWED.contains(&errno) => format!("{what} {errno:?}"),
            Err(errno) => return Err(format!("{what}: {errno}")),
        };
        *outcomes.entry(key).or_default() += 1;
        Ok(())
    };
    for _ in 0..copies {
        let a = &buffers[rng.below(buffers.len() as u64) as usize];
        let b = &buffers[rng.below(buffers.len() as u64) as usize];
        let length = rng.below(6000) + 1;
        let (src_offset, dst_offset) = (rng.below(a.size + 16), rng.below(b.size + 16));
        let bar = rng.below(8) as u32;
        let result = match rng.below(4) {
            0 => device.dma_copy_to_bar(a, src_offset, bar, dst_offset, length),
            1 => device.dma_copy_from_bar(bar, src_offset, a, dst_offset, length),
            _ => device.dma_copy((a, src_offset), (b, dst_offset), length),
        };
        match result {
            Ok(ticket) => {
                note("copy", Ok(()))?;
                let timeout = std::time::Duration::from_millis(rng.below(3));
                let waited = device.dma_wait(&ticket, Some(timeout)).map(|_| ());
                note(
                    "wait",
                    waited.map_err(|e| e.errno().unwrap_or(Errno::EINVAL)),
                )?;
            }
            Err(e) => note("copy", Err(e.errno().unwrap_or(Errno::EINVAL)))?,
        }
    }
    Ok(outcomes)
}
