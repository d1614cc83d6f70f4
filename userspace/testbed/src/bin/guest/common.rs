//! What the data-path checks share: finding devices, check failures.

use pcieipc::device::{BoundDevice, Device, DeviceKind, DeviceState, DEFAULT_PATH};

/// A failed check: printed by main, exit status 1.
pub type CheckResult = Result<(), String>;

/// Opens /dev/pcieipc.
pub fn open() -> Result<Device, String> {
    Device::open(DEFAULT_PATH).map_err(|e| e.to_string())
}

/// The bound devices of `kind`, by index.
pub fn bound(device: &Device, kind: DeviceKind) -> Result<Vec<BoundDevice>, String> {
    Ok(device
        .list()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|d| d.kind == kind && d.state == DeviceState::Bound)
        .collect())
}

/// The size of ivshmem's shared-memory BAR (BAR2) of `d`.
pub fn shared_bar_size(d: &BoundDevice) -> Result<usize, String> {
    d.bars
        .iter()
        .find(|b| b.index == 2 && b.mappable)
        .map(|b| b.size as usize)
        .ok_or_else(|| format!("device {} has no mappable BAR2", d.index))
}

/// A small deterministic generator (xorshift64*): the checks must not need
/// a crate for randomness, and a seed makes a failure reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
