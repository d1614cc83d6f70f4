// SPDX-License-Identifier: GPL-2.0

//! PCI error recovery (AER): a device under a reported error is frozen, which
//! fails its waiters with EIO, and bound again when recovery resumes it.
//!
//! 7.3's `pci::Driver` has no error handlers; this file installs a
//! `struct pci_error_handlers` in the module's registered `struct
//! pci_driver`, reached from the device being probed.

use core::{
    mem::offset_of,
    sync::atomic::{AtomicPtr, Ordering},
};

use kernel::{bindings, device::Core, pci};

use crate::{pci_info, registry};

static HANDLERS: bindings::pci_error_handlers = bindings::pci_error_handlers {
    error_detected: Some(error_detected),
    mmio_enabled: Some(recovered),
    slot_reset: Some(recovered),
    reset_prepare: None,
    reset_done: None,
    resume: Some(resume),
    cor_error_detected: None,
};

/// Installs the error handlers in the driver `pdev` is being probed by.
pub(crate) fn install(pdev: &pci::Device<Core<'_>>) {
    let raw = pci_info::raw(pdev);
    // SAFETY: during probe `dev.driver` is the `device_driver` embedded in
    // this module's registered `struct pci_driver` (it lives as long as the
    // module), so stepping back to the containing struct stays inside it.
    // The field is written atomically: the AER core may read it for another
    // bound device meanwhile, and every write stores the same pointer.
    unsafe {
        let driver = (*raw).dev.driver.cast::<u8>();
        let pci_driver = driver
            .sub(offset_of!(bindings::pci_driver, driver))
            .cast::<bindings::pci_driver>();
        let field = core::ptr::addr_of_mut!((*pci_driver).err_handler)
            .cast::<*mut bindings::pci_error_handlers>();
        AtomicPtr::from_ptr(field)
            .store(core::ptr::from_ref(&HANDLERS).cast_mut(), Ordering::Release);
    }
}

/// `error_detected`: freeze the device (waiters fail with EIO); ask for a
/// reset when the link is frozen, give up on a permanent failure.
unsafe extern "C" fn error_detected(
    dev: *mut bindings::pci_dev,
    state: bindings::pci_channel_state_t,
) -> bindings::pci_ers_result_t {
    if let Ok(device) = registry::get_bound_by_bdf(pci_info::bdf_of(dev)) {
        if state == bindings::pci_channel_io_perm_failure {
            device.mark_gone();
            return bindings::pci_ers_result_PCI_ERS_RESULT_DISCONNECT;
        }
        device.freeze();
    }
    if state == bindings::pci_channel_io_frozen {
        bindings::pci_ers_result_PCI_ERS_RESULT_NEED_RESET
    } else {
        bindings::pci_ers_result_PCI_ERS_RESULT_CAN_RECOVER
    }
}

/// `mmio_enabled` / `slot_reset`: the device answers again.
unsafe extern "C" fn recovered(_dev: *mut bindings::pci_dev) -> bindings::pci_ers_result_t {
    bindings::pci_ers_result_PCI_ERS_RESULT_RECOVERED
}

/// `resume`: recovery is over; the device is usable again.
unsafe extern "C" fn resume(dev: *mut bindings::pci_dev) {
    if let Ok(device) = registry::get_bound_by_bdf(pci_info::bdf_of(dev)) {
        device.thaw();
    }
}
