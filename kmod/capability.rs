// SPDX-License-Identifier: GPL-2.0

//! The module's privilege checks: `capable(CAP_SYS_ADMIN)` and the kernel
//! lockdown of raw PCI access.
//!
//! 7.3's kernel crate has neither `capable()` nor `security_locked_down()`;
//! this is the one place that calls them.

use kernel::{bindings, prelude::*};

extern "C" {
    /// `security_locked_down(LOCKDOWN_PCI_ACCESS)` (helpers.c): 0 when raw
    /// PCI access is allowed, a negative errno (`-EPERM`) when the kernel
    /// is locked down.
    fn pcieipc_locked_down_pci() -> c_int;
}

/// Fails with `EPERM` unless the caller has CAP_SYS_ADMIN: required by every
/// operation that touches hardware (BAR mmap, RING, DMA, link retraining,
/// watches, reset).
pub(crate) fn require_sys_admin() -> Result {
    // SAFETY: `capable` only reads the current task's credentials.
    if unsafe { bindings::capable(bindings::CAP_SYS_ADMIN as i32) } {
        Ok(())
    } else {
        Err(EPERM)
    }
}

/// Fails with `EPERM` while the kernel is locked down (lockdown LSM,
/// integrity or confidentiality mode): required, after
/// [`require_sys_admin`], by the operations that give userspace raw PCI
/// access, as sysfs `config`/`resourceN` writes and mmaps require it: BAR
/// mmap, config-space writes (link retraining, reset) and CPU copies between
/// a DMA buffer and a BAR. Always succeeds on a kernel without
/// CONFIG_SECURITY.
pub(crate) fn require_pci_access() -> Result {
    // SAFETY: `security_locked_down` only reads the LSMs' lockdown state; it
    // may log a rate-limited notice naming the current task.
    let ret = unsafe { pcieipc_locked_down_pci() };
    if ret == 0 {
        Ok(())
    } else {
        Err(EPERM)
    }
}
