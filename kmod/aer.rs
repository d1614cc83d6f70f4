// SPDX-License-Identifier: GPL-2.0

//! PCI error recovery (AER) callbacks for a `pci::Driver`.
//!
//! 7.3's `kernel::pci` has no error handlers. `AerAdapter` is the PCI
//! adapter of the kernel crate with one addition: before the driver is
//! registered, its `err_handler` is pointed at a static table whose callbacks
//! hand the device, as a `pci::Device<Bound>`, to the driver's safe
//! `ErrorHandler` methods. This is the one place that sees the raw
//! `struct pci_error_handlers`.

use core::marker::PhantomData;

use kernel::{
    bindings,
    device::Bound,
    driver::{DriverLayout, RegistrationOps},
    pci,
    prelude::*,
    types::Opaque,
};

use crate::pci_info;

/// The state of the device's channel (`pci_channel_state_t`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Channel {
    /// I/O still works (a non-fatal error).
    Normal = bindings::pci_channel_io_normal,
    /// I/O is blocked until the link is reset.
    Frozen = bindings::pci_channel_io_frozen,
    /// The device is lost.
    PermanentFailure = bindings::pci_channel_io_perm_failure,
}

impl Channel {
    fn from_raw(state: bindings::pci_channel_state_t) -> Self {
        match state {
            bindings::pci_channel_io_normal => Self::Normal,
            bindings::pci_channel_io_frozen => Self::Frozen,
            _ => Self::PermanentFailure,
        }
    }
}

/// What a callback asks of the recovery (`pci_ers_result_t`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Recovery {
    /// No opinion (the callbacks that return nothing record this).
    None = bindings::pci_ers_result_PCI_ERS_RESULT_NONE,
    CanRecover = bindings::pci_ers_result_PCI_ERS_RESULT_CAN_RECOVER,
    NeedReset = bindings::pci_ers_result_PCI_ERS_RESULT_NEED_RESET,
    Disconnect = bindings::pci_ers_result_PCI_ERS_RESULT_DISCONNECT,
    Recovered = bindings::pci_ers_result_PCI_ERS_RESULT_RECOVERED,
}

/// The error callbacks of a PCI driver, as in `struct pci_error_handlers`;
/// each gets the device and the state of its channel.
pub(crate) trait ErrorHandler {
    fn error_detected(pdev: &pci::Device<Bound>, channel: Channel) -> Recovery;
    fn mmio_enabled(pdev: &pci::Device<Bound>, channel: Channel) -> Recovery;
    fn slot_reset(pdev: &pci::Device<Bound>, channel: Channel) -> Recovery;
    fn resume(pdev: &pci::Device<Bound>, channel: Channel);
    fn cor_error_detected(pdev: &pci::Device<Bound>, channel: Channel);
}

/// Puts back the config space that the PCI core saved at enumeration (BARs,
/// command register, MSI-X), after a reset lost it.
pub(crate) fn restore_state(pdev: &pci::Device<Bound>) {
    // SAFETY: `pdev` is a live, bound device.
    unsafe { bindings::pci_restore_state(pci_info::raw(pdev)) };
}

/// `kernel::pci::Adapter<T>` plus error handlers.
pub(crate) struct AerAdapter<T: pci::Driver + ErrorHandler>(PhantomData<T>);

// SAFETY: the layout is the kernel crate's PCI adapter's, field for field.
unsafe impl<T: pci::Driver + ErrorHandler + 'static> DriverLayout for AerAdapter<T> {
    type DriverType = <pci::Adapter<T> as DriverLayout>::DriverType;
    type DriverData<'bound> = <pci::Adapter<T> as DriverLayout>::DriverData<'bound>;
    const DEVICE_DRIVER_OFFSET: usize = <pci::Adapter<T> as DriverLayout>::DEVICE_DRIVER_OFFSET;
}

// SAFETY: registration and unregistration are the PCI adapter's; the only
// addition is a pointer to a static table, set before registering.
unsafe impl<T: pci::Driver + ErrorHandler + 'static> RegistrationOps for AerAdapter<T> {
    unsafe fn register(
        pdrv: &Opaque<Self::DriverType>,
        name: &'static CStr,
        module: &'static ThisModule,
    ) -> Result {
        // SAFETY: the driver struct is being initialised and not yet
        // registered; the table is static.
        unsafe { (*pdrv.get()).err_handler = Self::ERROR_HANDLERS };
        // SAFETY: forwarded with this function's own guarantees.
        unsafe { <pci::Adapter<T> as RegistrationOps>::register(pdrv, name, module) }
    }

    unsafe fn unregister(pdrv: &Opaque<Self::DriverType>) {
        // SAFETY: forwarded with this function's own guarantees.
        unsafe { <pci::Adapter<T> as RegistrationOps>::unregister(pdrv) }
    }
}

impl<T: pci::Driver + ErrorHandler + 'static> AerAdapter<T> {
    const TABLE: bindings::pci_error_handlers = bindings::pci_error_handlers {
        error_detected: Some(Self::error_detected),
        mmio_enabled: Some(Self::mmio_enabled),
        slot_reset: Some(Self::slot_reset),
        reset_prepare: None,
        reset_done: None,
        resume: Some(Self::resume),
        cor_error_detected: Some(Self::cor_error_detected),
    };
    const ERROR_HANDLERS: &'static bindings::pci_error_handlers = &Self::TABLE;

    /// The device of a callback and the state of its channel.
    ///
    /// # Safety
    ///
    /// `pdev` is the device the AER core passed to a callback: bound to this
    /// driver (the core holds the device lock and checked its driver) for the
    /// duration of the callback, which `'a` does not outlive.
    unsafe fn device<'a>(pdev: *mut bindings::pci_dev) -> (&'a pci::Device<Bound>, Channel) {
        // SAFETY: `pci::Device` is a transparent wrapper of `struct pci_dev`;
        // the device is bound for `'a` (this function's requirement), and
        // `error_state` is set by the AER core before it calls a driver.
        unsafe { (&*pdev.cast(), Channel::from_raw((*pdev).error_state)) }
    }

    /// # Safety
    ///
    /// Called by the AER core with a device bound to this driver.
    unsafe extern "C" fn error_detected(
        pdev: *mut bindings::pci_dev,
        state: bindings::pci_channel_state_t,
    ) -> bindings::pci_ers_result_t {
        // SAFETY: the AER core passes a device bound to this driver.
        let (pdev, _) = unsafe { Self::device(pdev) };
        T::error_detected(pdev, Channel::from_raw(state)) as u32
    }

    /// # Safety
    ///
    /// As `error_detected`.
    unsafe extern "C" fn mmio_enabled(pdev: *mut bindings::pci_dev) -> bindings::pci_ers_result_t {
        // SAFETY: as in `error_detected`.
        let (pdev, channel) = unsafe { Self::device(pdev) };
        T::mmio_enabled(pdev, channel) as u32
    }

    /// # Safety
    ///
    /// As `error_detected`.
    unsafe extern "C" fn slot_reset(pdev: *mut bindings::pci_dev) -> bindings::pci_ers_result_t {
        // SAFETY: as in `error_detected`.
        let (pdev, channel) = unsafe { Self::device(pdev) };
        T::slot_reset(pdev, channel) as u32
    }

    /// # Safety
    ///
    /// As `error_detected`.
    unsafe extern "C" fn resume(pdev: *mut bindings::pci_dev) {
        // SAFETY: as in `error_detected`.
        let (pdev, channel) = unsafe { Self::device(pdev) };
        T::resume(pdev, channel);
    }

    /// # Safety
    ///
    /// As `error_detected`.
    unsafe extern "C" fn cor_error_detected(pdev: *mut bindings::pci_dev) {
        // SAFETY: as in `error_detected`.
        let (pdev, channel) = unsafe { Self::device(pdev) };
        T::cor_error_detected(pdev, channel);
    }
}
