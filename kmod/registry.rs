// SPDX-License-Identifier: GPL-2.0

//! The devices the module has bound, by index: the link between the PCI
//! driver (which adds and marks gone) and `/dev/pcieipc` (which looks up).

use kernel::{prelude::*, sync::Arc};

use crate::bound_device::BoundDevice;

/// The devices, and the index the next one gets (indices are never reused
/// while the module is loaded, so a stale index cannot reach a new device).
pub(crate) struct Devices {
    devices: KVec<Arc<BoundDevice>>,
    next_index: u32,
}

kernel::sync::global_lock! {
    // SAFETY: initialised in the module initialiser before the PCI driver and
    // the misc device that use it are registered.
    unsafe(uninit) static REGISTRY: Mutex<Devices> = Devices {
        devices: KVec::new(),
        next_index: 0,
    };
}

/// Initialises the registry.
///
/// # Safety
///
/// Called once, before any other function of this module.
pub(crate) unsafe fn init() {
    // SAFETY: by this function's requirement, called once before first use.
    unsafe { REGISTRY.init() };
}

/// Reserves the index of a device about to be added.
pub(crate) fn next_index() -> u32 {
    let mut registry = REGISTRY.lock();
    let index = registry.next_index;
    registry.next_index += 1;
    index
}

/// Adds a bound device; a gone device of the same BDF leaves the list.
pub(crate) fn add(device: Arc<BoundDevice>) -> Result {
    let mut registry = REGISTRY.lock();
    let bdf = device.info.bdf;
    registry.devices.retain(|d| d.info.bdf != bdf);
    registry.devices.push(device, GFP_KERNEL)?;
    Ok(())
}

/// The device of `index`, bound or gone.
pub(crate) fn get(index: u32) -> Result<Arc<BoundDevice>> {
    let registry = REGISTRY.lock();
    registry
        .devices
        .iter()
        .find(|d| d.index == index)
        .cloned()
        .ok_or(ENOENT)
}

/// The device of `bdf` that is not gone (bound or frozen).
pub(crate) fn get_bound_by_bdf(bdf: u32) -> Result<Arc<BoundDevice>> {
    let registry = REGISTRY.lock();
    registry
        .devices
        .iter()
        .find(|d| d.info.bdf == bdf && d.state() != crate::uapi::PCIEIPC_STATE_GONE)
        .cloned()
        .ok_or(ENODEV)
}

/// Calls `f` on every listed device, in index order.
pub(crate) fn for_each(mut f: impl FnMut(&BoundDevice) -> Result) -> Result {
    let registry = REGISTRY.lock();
    registry.devices.iter().try_for_each(|d| f(d))
}

/// How many listed devices are bound.
pub(crate) fn bound_count() -> u32 {
    let registry = REGISTRY.lock();
    registry
        .devices
        .iter()
        .filter(|d| d.check_usable().is_ok())
        .count() as u32
}
