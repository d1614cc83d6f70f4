// SPDX-License-Identifier: GPL-2.0

//! What the driver does when the AER core reports an error on a device it
//! drives. Each callback records an AER event (registers, channel state, the
//! result it returns); error_detected freezes the device (its waiters fail
//! with EIO), slot_reset restores its config space, resume thaws it, a
//! permanent failure makes it gone.

use kernel::{device::Bound, pci};

use crate::{
    aer::{self, Channel, ErrorHandler, Recovery},
    fault,
    pci_driver::{self, PcieIpcDriver},
    pci_function::PciFunction,
    pci_info, registry, uapi,
};

/// What a callback does to the bound device's state.
enum Transition {
    Keep,
    Freeze,
    Thaw,
    Gone,
}

/// Records one callback: the AER registers that logged the error (the
/// device's own, or a port's above it: `PciFunction::logged_aer_regs`) and
/// the result returned; updates the device state
/// (a freeze or thaw before the event, the device's end after it).
fn record(
    pdev: &pci::Device<Bound>,
    step: u32,
    channel: Channel,
    result: Recovery,
    transition: Transition,
) -> Recovery {
    // Probe refuses devices whose BDF does not fit the encoding.
    let Some(bdf) = pci_info::bdf(pdev) else {
        return result;
    };
    let aer = PciFunction::find(bdf)
        .map(|function| function.logged_aer_regs())
        .unwrap_or_default();
    let event = uapi::pcieipc_event {
        kind: uapi::PCIEIPC_EVENT_AER,
        bdf,
        aer_step: step,
        channel_state: channel as u32,
        result: result as u32,
        aer,
        ..Default::default()
    };
    let device = registry::get_bound_by_bdf(bdf).ok();
    match (&transition, &device) {
        (Transition::Freeze, Some(device)) => device.freeze(),
        (Transition::Thaw, Some(device)) => device.thaw(),
        _ => {}
    }
    if let Ok(fault) = fault::state() {
        fault.events.emit(event);
    }
    // After the error's event: `device_gone` queues DEVICE_GONE, so a rank
    // reads why its device went before it reads that it went.
    if let (Transition::Gone, Some(device)) = (transition, device) {
        pci_driver::device_gone(&device);
    }
    result
}

impl ErrorHandler for PcieIpcDriver {
    fn error_detected(pdev: &pci::Device<Bound>, channel: Channel) -> Recovery {
        // Any reported error freezes the device until resume: a transfer that
        // overlapped the error cannot be trusted even if the link survived.
        let (result, transition) = match channel {
            Channel::Normal => (Recovery::CanRecover, Transition::Freeze),
            Channel::Frozen => (Recovery::NeedReset, Transition::Freeze),
            Channel::PermanentFailure => (Recovery::Disconnect, Transition::Gone),
        };
        let step = uapi::PCIEIPC_AER_ERROR_DETECTED;
        record(pdev, step, channel, result, transition)
    }

    fn mmio_enabled(pdev: &pci::Device<Bound>, channel: Channel) -> Recovery {
        let step = uapi::PCIEIPC_AER_MMIO_ENABLED;
        record(pdev, step, channel, Recovery::Recovered, Transition::Keep)
    }

    fn slot_reset(pdev: &pci::Device<Bound>, channel: Channel) -> Recovery {
        // The reset lost the device's config space.
        aer::restore_state(pdev);
        let step = uapi::PCIEIPC_AER_SLOT_RESET;
        record(pdev, step, channel, Recovery::Recovered, Transition::Keep)
    }

    fn resume(pdev: &pci::Device<Bound>, channel: Channel) {
        let step = uapi::PCIEIPC_AER_RESUME;
        record(pdev, step, channel, Recovery::None, Transition::Thaw);
    }

    fn cor_error_detected(pdev: &pci::Device<Bound>, channel: Channel) {
        let step = uapi::PCIEIPC_AER_COR_ERROR_DETECTED;
        record(pdev, step, channel, Recovery::None, Transition::Keep);
    }
}
