// SPDX-License-Identifier: GPL-2.0

//! The fault path's module-wide state (event log, watches) and its ioctls:
//! LINK_STATUS, LINK_RETRAIN, WATCH.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::{Instant, Monotonic},
};

use crate::{
    bar_mmap,
    capability::{require_pci_access, require_sys_admin},
    events::EventLog,
    link,
    link_control::{self, Address},
    pci_function::{regs, PciFunction},
    registry,
    uapi::{self, ArgszArg},
    watch::Watch,
};

/// At most this many functions are watched at once.
const MAX_WATCHES: usize = 64;

#[pin_data]
pub(crate) struct FaultState {
    pub(crate) events: Arc<EventLog>,
    #[pin]
    watches: Mutex<KVec<Arc<Watch>>>,
    /// Held for the whole of a retrain (see `link_retrain`).
    #[pin]
    retrains: Mutex<()>,
}

kernel::sync::global_lock! {
    // SAFETY: initialised in the module initialiser before /dev/pcieipc exists.
    unsafe(uninit) static FAULT_STATE: Mutex<Option<Arc<FaultState>>> = None;
}

/// Creates the module-wide state.
///
/// # Safety
///
/// Called once, before any other function of this module.
pub(crate) unsafe fn init() -> Result {
    // SAFETY: by this function's requirement, called once before first use.
    unsafe { FAULT_STATE.init() };
    let state = Arc::pin_init(
        try_pin_init!(FaultState {
            events: Arc::pin_init(EventLog::new(), GFP_KERNEL)?,
            watches <- new_mutex!(KVec::new()),
            retrains <- new_mutex!(()),
        }),
        GFP_KERNEL,
    )?;
    *FAULT_STATE.lock() = Some(state);
    Ok(())
}

/// Stops every watch and drops the state; called from the module's exit.
pub(crate) fn exit() {
    let state = FAULT_STATE.lock().take();
    if let Some(state) = state {
        let watches = core::mem::take(&mut *state.watches.lock());
        for watch in watches.iter() {
            watch.stop();
        }
    }
}

/// The module-wide state (present from init to exit).
pub(crate) fn state() -> Result<Arc<FaultState>> {
    FAULT_STATE.lock().clone().ok_or(ENODEV)
}

/// A bound device is leaving (unbind, hot-unplug, module unload, a
/// permanent PCI error): a DEVICE_GONE event, whether or not the function
/// was watched.
pub(crate) fn device_removed(bdf: u32) {
    if let Ok(state) = state() {
        state.events.emit(uapi::pcieipc_event {
            kind: uapi::PCIEIPC_EVENT_DEVICE_GONE,
            bdf,
            ..Default::default()
        });
    }
}

/// `PCIEIPC_IOC_LINK_STATUS`.
pub(crate) fn link_status(arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_link_status>::read(arg)?;
    if arg.value.flags != 0 {
        return Err(EINVAL);
    }
    let function = PciFunction::find(arg.value.bdf)?;
    let mut status = link::status(&function);
    status.argsz = arg.value.argsz;
    arg.value = status;
    arg.write_back()?;
    Ok(0)
}

/// Why the link above a function may not be retrained by this module.
struct Refusal {
    reason: uapi::pcieipc_link_refusal,
    /// The function that made it refuse.
    bdf: u32,
    errno: Error,
}

/// Whether the port `function` hangs from serves a device this module binds
/// (a frozen one too: a retrain may be what recovers its link).
fn serves_bound_device(port: &PciFunction) -> Result<bool> {
    let mut served = false;
    registry::for_each(|device| {
        if device.state() != uapi::PCIEIPC_STATE_GONE {
            let above = PciFunction::find(device.info.bdf)
                .ok()
                .and_then(|d| d.upstream_bridge())
                .map(|p| p.bdf());
            served |= above == Some(port.bdf());
        }
        Ok(())
    })?;
    Ok(served)
}

/// Retraining takes a link down for its duration, so it needs the owner's
/// consent: the port must serve a device this module binds, or root listed
/// `function` in `link_control` (another driver owns it: a GPU). A listed
/// device whose port has a mass-storage function below is still refused: a
/// boot disk's link is never taken down. A target speed on a port whose
/// speed the kernel's bandwidth controller sets must go through the kernel
/// (its cooling device), which serialises it with the kernel's own changes:
/// EBUSY says so to a caller that is otherwise allowed.
fn refusal(
    function: &PciFunction,
    port: &PciFunction,
    target_speed: u8,
) -> Result<Option<Refusal>> {
    let refuse = |reason, bdf, errno| Ok(Some(Refusal { reason, bdf, errno }));
    if !serves_bound_device(port)? {
        if !link_control::is_listed(function.bdf()) {
            return refuse(
                uapi::PCIEIPC_LINK_REFUSED_NOT_ALLOWED,
                function.bdf(),
                EACCES,
            );
        }
        let storage = |class: u32| class >> 16 == regs::PCI_BASE_CLASS_STORAGE;
        if let Some(disk) = port.find_below(storage) {
            return refuse(uapi::PCIEIPC_LINK_REFUSED_STORAGE, disk.bdf(), EACCES);
        }
    }
    if target_speed != 0 && port.has_bandwidth_cooling_device() {
        return refuse(
            uapi::PCIEIPC_LINK_REFUSED_BANDWIDTH_CONTROLLER,
            port.bdf(),
            EBUSY,
        );
    }
    Ok(None)
}

/// Says in the kernel log why a retrain was refused, and how root allows it.
fn log_refusal(function: &PciFunction, port: &PciFunction, refusal: &Refusal) {
    let (device, port_address, by) = (
        Address(function.bdf()),
        Address(port.bdf()),
        Address(refusal.bdf),
    );
    match refusal.reason {
        uapi::PCIEIPC_LINK_REFUSED_NOT_ALLOWED => pr_notice!(
            "retrain of the link above {device} refused: pcieipc does not bind it and root did not list it in link_control; to allow it: add {device} to /sys/module/pcieipc/parameters/link_control (pcieipc link allow {device})\n"
        ),
        uapi::PCIEIPC_LINK_REFUSED_STORAGE => pr_notice!(
            "retrain of the link above {device} refused: mass-storage function {by} is below port {port_address}, whose link is never taken down, listed or not\n"
        ),
        uapi::PCIEIPC_LINK_REFUSED_BANDWIDTH_CONTROLLER => pr_notice!(
            "target speed for the link above {device} refused: the kernel's bandwidth controller sets port {port_address}'s speed; write it through the cooling device PCIe_Port_Link_Speed_{port_address}\n"
        ),
        _ => {}
    }
}

/// `PCIEIPC_IOC_LINK_RETRAIN`.
pub(crate) fn link_retrain(state: &FaultState, arg: usize) -> Result<isize> {
    require_sys_admin()?;
    require_pci_access()?;
    let mut arg = ArgszArg::<uapi::pcieipc_link_retrain>::read(arg)?;
    let target_speed = arg.value.target_speed;
    if arg.value.flags != 0
        || arg.value.reserved != [0; 3]
        || (target_speed > 6 && u32::from(target_speed) != uapi::PCIEIPC_LINK_SPEED_MAX)
    {
        return Err(EINVAL);
    }
    let function = PciFunction::find(arg.value.bdf)?;
    let port = link::retrain_port(&function)?;
    if let Some(refusal) = refusal(&function, &port, target_speed)? {
        log_refusal(&function, &port, &refusal);
        arg.value.refused = refusal.reason;
        arg.value.refused_bdf = refusal.bdf;
        arg.write_back()?;
        return Err(refusal.errno);
    }
    // One retrain at a time: each saves and restores the Target Link Speed,
    // so two interleaved could leave the other's lowered speed behind.
    let retrain = {
        let _serialised = state.retrains.lock();
        link::retrain(&function, target_speed, arg.value.timeout_ms)?
    };
    let errno = match retrain.outcome {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    };
    state.events.emit(uapi::pcieipc_event {
        kind: uapi::PCIEIPC_EVENT_LINK_RETRAIN,
        bdf: arg.value.bdf,
        result: errno as u32,
        link_before: retrain.before,
        link_after: retrain.after,
        ..Default::default()
    });
    arg.value.before = retrain.before;
    arg.value.after = retrain.after;
    arg.value.elapsed_us = retrain.elapsed_us;
    arg.write_back()?;
    retrain.outcome.map(|()| 0)
}

/// `PCIEIPC_IOC_RESET`.
pub(crate) fn reset(state: &FaultState, arg: usize) -> Result<isize> {
    require_sys_admin()?;
    require_pci_access()?;
    let mut arg = ArgszArg::<uapi::pcieipc_reset>::read(arg)?;
    if arg.value.flags != 0 {
        return Err(EINVAL);
    }
    let device = registry::get(arg.value.device)?;
    device.check_usable()?;
    let function = PciFunction::find(device.info.bdf)?;
    // Frozen while the reset runs: waiters fail with EIO. The BAR windows
    // are zapped and their faults wait for the reset's end, so no process
    // reaches the device mid-reset, and every page maps afresh after it.
    device.begin_reset();
    bar_mmap::zap_device(device.index);
    let start = Instant::<Monotonic>::now();
    let outcome = function.reset();
    arg.value.elapsed_us = start
        .elapsed()
        .as_micros_ceil()
        .clamp(0, i64::from(u32::MAX)) as u32;
    device.end_reset();
    state.events.emit(uapi::pcieipc_event {
        kind: uapi::PCIEIPC_EVENT_RESET,
        bdf: device.info.bdf,
        result: outcome.err().map_or(0, |e| e.to_errno()) as u32,
        ..Default::default()
    });
    outcome?;
    arg.write_back()?;
    Ok(0)
}

/// `PCIEIPC_IOC_WATCH`.
pub(crate) fn watch(state: &FaultState, arg: usize) -> Result<isize> {
    require_sys_admin()?;
    let arg = ArgszArg::<uapi::pcieipc_watch>::read(arg)?;
    let request = arg.value;
    let mut watches = state.watches.lock();
    let existing = watches.iter().position(|w| w.bdf == request.bdf);
    match request.flags {
        uapi::PCIEIPC_WATCH_ADD => {
            if existing.is_some() {
                return Err(EEXIST);
            }
            if watches.len() >= MAX_WATCHES {
                return Err(ENOSPC);
            }
            let function = PciFunction::find(request.bdf)?;
            let watch = Watch::start(function, request.period_ms, state.events.clone())?;
            watches.push(watch, GFP_KERNEL)?;
        }
        uapi::PCIEIPC_WATCH_REMOVE => {
            let index = existing.ok_or(ENOENT)?;
            let watch = watches.remove(index)?;
            drop(watches);
            watch.stop();
        }
        _ => return Err(EINVAL),
    }
    Ok(0)
}
