// SPDX-License-Identifier: GPL-2.0

//! AER error hooks for the devices the PCI driver binds.
//!
//! 7.3's `kernel::pci` has no error handlers. `AerAdapter` is the PCI
//! adapter of the kernel crate with one addition: before the driver is
//! registered, its `err_handler` is pointed at `ERROR_HANDLERS`. Each
//! callback records an AER event (registers, channel state, the result it
//! returns); error_detected freezes the bound device (its waiters fail with
//! EIO), resume thaws it, a permanent failure marks it gone.

use core::marker::PhantomData;

use kernel::{
    bindings,
    driver::{DriverLayout, RegistrationOps},
    pci,
    prelude::*,
    types::Opaque,
};

use crate::{fault, pci_function::PciFunction, pci_info, registry, uapi};

/// `kernel::pci::Adapter<T>` plus error handlers.
pub(crate) struct AerAdapter<T: pci::Driver>(PhantomData<T>);

// SAFETY: the layout is the kernel crate's PCI adapter's, field for field.
unsafe impl<T: pci::Driver + 'static> DriverLayout for AerAdapter<T> {
    type DriverType = <pci::Adapter<T> as DriverLayout>::DriverType;
    type DriverData<'bound> = <pci::Adapter<T> as DriverLayout>::DriverData<'bound>;
    const DEVICE_DRIVER_OFFSET: usize = <pci::Adapter<T> as DriverLayout>::DEVICE_DRIVER_OFFSET;
}

// SAFETY: registration and unregistration are the PCI adapter's; the only
// addition is a pointer to a static table, set before registering.
unsafe impl<T: pci::Driver + 'static> RegistrationOps for AerAdapter<T> {
    unsafe fn register(pdrv: &Opaque<Self::DriverType>, name: &'static CStr, module: &'static ThisModule) -> Result {
        // SAFETY: the driver struct is being initialised and not yet
        // registered; `ERROR_HANDLERS` is static.
        unsafe { (*pdrv.get()).err_handler = &ERROR_HANDLERS };
        // SAFETY: forwarded with this function's own guarantees.
        unsafe { <pci::Adapter<T> as RegistrationOps>::register(pdrv, name, module) }
    }

    unsafe fn unregister(pdrv: &Opaque<Self::DriverType>) {
        // SAFETY: forwarded with this function's own guarantees.
        unsafe { <pci::Adapter<T> as RegistrationOps>::unregister(pdrv) }
    }
}

static ERROR_HANDLERS: bindings::pci_error_handlers = bindings::pci_error_handlers {
    error_detected: Some(error_detected),
    mmio_enabled: Some(mmio_enabled),
    slot_reset: Some(slot_reset),
    reset_prepare: None,
    reset_done: None,
    resume: Some(resume),
    cor_error_detected: Some(cor_error_detected),
};

const RESULT_NONE: u32 = bindings::pci_ers_result_PCI_ERS_RESULT_NONE;
const RESULT_CAN_RECOVER: u32 = bindings::pci_ers_result_PCI_ERS_RESULT_CAN_RECOVER;
const RESULT_NEED_RESET: u32 = bindings::pci_ers_result_PCI_ERS_RESULT_NEED_RESET;
const RESULT_DISCONNECT: u32 = bindings::pci_ers_result_PCI_ERS_RESULT_DISCONNECT;
const RESULT_RECOVERED: u32 = bindings::pci_ers_result_PCI_ERS_RESULT_RECOVERED;

/// The BDF and channel state of the device a callback is about.
///
/// # Safety
///
/// `pdev` is the device the AER core passed to a callback.
unsafe fn bdf_of(pdev: *mut bindings::pci_dev) -> (u32, u32) {
    // SAFETY: the caller passes a valid device.
    (pci_info::bdf_of(pdev), unsafe { (*pdev).error_state })
}

/// What a callback does to the bound device's state.
enum Transition {
    Keep,
    Freeze,
    Thaw,
    Gone,
}

/// Records one callback: the registers of the nearest AER capability (the
/// device's own, else its upstream port's, where errors of a conventional
/// endpoint are logged) and the result returned; updates the device state.
fn record(bdf: u32, step: u32, channel_state: u32, result: u32, transition: Transition) {
    let aer = PciFunction::find(bdf)
        .map(|function| {
            let own = function.aer_regs();
            if own.present != 0 {
                own
            } else {
                function.upstream_bridge().map_or(own, |port| port.aer_regs())
            }
        })
        .unwrap_or_default();
    if let Ok(device) = registry::get_bound_by_bdf(bdf) {
        match transition {
            Transition::Keep => {}
            Transition::Freeze => device.freeze(),
            Transition::Thaw => device.thaw(),
            Transition::Gone => device.mark_gone(),
        }
    }
    if let Ok(fault) = fault::state() {
        fault.events.emit(uapi::pcieipc_event {
            kind: uapi::PCIEIPC_EVENT_AER,
            bdf,
            aer_step: step,
            channel_state,
            result,
            aer,
            ..Default::default()
        });
    }
}

/// # Safety
///
/// Called by the AER core with a device bound to this driver.
unsafe extern "C" fn error_detected(pdev: *mut bindings::pci_dev, state: bindings::pci_channel_state_t) -> u32 {
    // SAFETY: the AER core passes a valid device.
    let (bdf, _) = unsafe { bdf_of(pdev) };
    // Any reported error freezes the device until resume: a transfer that
    // overlapped the error cannot be trusted even if the link survived.
    let (result, transition) = match state {
        bindings::pci_channel_io_normal => (RESULT_CAN_RECOVER, Transition::Freeze),
        bindings::pci_channel_io_frozen => (RESULT_NEED_RESET, Transition::Freeze),
        _ => (RESULT_DISCONNECT, Transition::Gone),
    };
    record(bdf, uapi::PCIEIPC_AER_ERROR_DETECTED, state, result, transition);
    result
}

/// # Safety
///
/// As `error_detected`.
unsafe extern "C" fn mmio_enabled(pdev: *mut bindings::pci_dev) -> u32 {
    // SAFETY: the AER core passes a valid device.
    let (bdf, channel) = unsafe { bdf_of(pdev) };
    record(bdf, uapi::PCIEIPC_AER_MMIO_ENABLED, channel, RESULT_RECOVERED, Transition::Keep);
    RESULT_RECOVERED
}

/// # Safety
///
/// As `error_detected`.
unsafe extern "C" fn slot_reset(pdev: *mut bindings::pci_dev) -> u32 {
    // The reset lost the device's config space: put back what the PCI core
    // saved at enumeration (BARs, command register, MSI-X).
    // SAFETY: the AER core passes a valid device.
    unsafe { bindings::pci_restore_state(pdev) };
    // SAFETY: as above.
    let (bdf, channel) = unsafe { bdf_of(pdev) };
    record(bdf, uapi::PCIEIPC_AER_SLOT_RESET, channel, RESULT_RECOVERED, Transition::Keep);
    RESULT_RECOVERED
}

/// # Safety
///
/// As `error_detected`.
unsafe extern "C" fn resume(pdev: *mut bindings::pci_dev) {
    // SAFETY: the AER core passes a valid device.
    let (bdf, channel) = unsafe { bdf_of(pdev) };
    record(bdf, uapi::PCIEIPC_AER_RESUME, channel, RESULT_NONE, Transition::Thaw);
}

/// # Safety
///
/// As `error_detected`.
unsafe extern "C" fn cor_error_detected(pdev: *mut bindings::pci_dev) {
    // SAFETY: the AER core passes a valid device.
    let (bdf, channel) = unsafe { bdf_of(pdev) };
    record(bdf, uapi::PCIEIPC_AER_COR_ERROR_DETECTED, channel, RESULT_NONE, Transition::Keep);
}
