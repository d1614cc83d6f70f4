// SPDX-License-Identifier: GPL-2.0

//! A device the module drives, as the ioctls see it: its identity, its
//! interrupt counters with their waiters, and its register BAR.
//!
//! One `BoundDevice` lives in an `Arc` shared by the PCI driver's data (which
//! marks it gone on unbind), the IRQ handlers, the registry and any ioctl in
//! flight, so an ioctl never touches freed memory; the hardware itself is
//! reached only through the revocable `regs`, which unbind revokes.

use kernel::{
    io::Io,
    new_condvar, new_mutex, new_spinlock_irq, pci,
    prelude::*,
    sync::{aref::ARef, Arc, CondVar, CondVarTimeoutResult, Mutex, SpinLockIrq},
    time::{msecs_to_jiffies, Jiffies},
};

use crate::{
    dma_engine::{CopyEngine, CpuEngine, EduCopyEngine, EduEngine, Transfer, EDU_IRQ_DMA},
    pci_info::{self, BarInfo, MappedBar},
    uapi,
};

/// Number of counters kept per device.
pub(crate) const MAX_VECTORS: usize = uapi::PCIEIPC_MAX_VECTORS as usize;

/// What the module knows how to drive (`pcieipc_device_kind`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceKind {
    Generic,
    Ivshmem,
    Edu,
}

impl DeviceKind {
    pub(crate) fn from_ids(vendor: u16, device: u16) -> Self {
        match (vendor, device) {
            (0x1af4, 0x1110) => DeviceKind::Ivshmem,
            (0x1234, 0x11e8) => DeviceKind::Edu,
            _ => DeviceKind::Generic,
        }
    }

    pub(crate) fn as_uapi(self) -> u32 {
        match self {
            DeviceKind::Generic => uapi::PCIEIPC_KIND_GENERIC,
            DeviceKind::Ivshmem => uapi::PCIEIPC_KIND_IVSHMEM,
            DeviceKind::Edu => uapi::PCIEIPC_KIND_EDU,
        }
    }
}

/// The identity of a device, fixed at probe.
pub(crate) struct DeviceInfo {
    pub(crate) bdf: u32,
    pub(crate) upstream_bdf: u32,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) class_code: u32,
    pub(crate) kind: DeviceKind,
    pub(crate) irq_type: u32,
    pub(crate) num_vectors: usize,
    pub(crate) link_speed: u16,
    pub(crate) link_width: u16,
    pub(crate) peer_id: u32,
    pub(crate) bars: [BarInfo; uapi::PCIEIPC_NUM_BARS as usize],
}

/// Interrupt counters and device state, shared with the hard IRQ handlers.
struct Events {
    counts: [u64; MAX_VECTORS],
    /// `pcieipc_device_state`.
    state: u32,
    /// PCI errors reported so far: a wait that sees this change fails with
    /// EIO even if recovery already thawed the device.
    errors: u64,
    /// Whether the handler masked the INTx line (`masks_intx` devices): only
    /// a line the handler masked is the waiters' to unmask.
    intx_masked: bool,
    /// A function reset is in progress (`begin_reset`): BAR faults wait.
    resetting: bool,
    /// Ioctls in flight that hold the device's DMA memory (`DeviceUse`).
    users: usize,
}

#[pin_data]
pub(crate) struct BoundDevice {
    /// The handle userspace passes to every ioctl.
    pub(crate) index: u32,
    pub(crate) info: DeviceInfo,
    /// The PCI device, for DMA allocations (a reference: it outlives unbind).
    pub(crate) pdev: ARef<pci::Device>,
    /// BAR0, for the kinds whose registers the module drives.
    pub(crate) regs: Option<MappedBar>,
    /// The mappable BARs of at most PCIEIPC_DMA_BAR_MAX_SIZE, mapped into
    /// the kernel for CPU copies between them and DMA buffers.
    pub(crate) windows: [Option<MappedBar>; uapi::PCIEIPC_NUM_BARS as usize],
    /// edu's DMA engine (idle on other kinds).
    #[pin]
    edu_dma: EduEngine,
    #[pin]
    events: SpinLockIrq<Events>,
    /// Notified on every interrupt and on every state change.
    #[pin]
    changed: CondVar,
    /// Who may have the device master the bus. Held across every change
    /// of Bus Master Enable.
    #[pin]
    mastering: Mutex<Mastering>,
}

/// What Bus Master Enable follows.
struct Mastering {
    /// The device was retired (unbind): bus mastering is off for good.
    retired: bool,
    /// The DMA buffers allocated for the device that exist (`mappings`).
    buffers: usize,
}

impl BoundDevice {
    pub(crate) fn new(
        index: u32,
        info: DeviceInfo,
        pdev: ARef<pci::Device>,
        regs: Option<MappedBar>,
        windows: [Option<MappedBar>; uapi::PCIEIPC_NUM_BARS as usize],
    ) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            index,
            info,
            pdev,
            regs,
            windows,
            edu_dma <- EduEngine::new(),
            events <- new_spinlock_irq!(Events {
                counts: [0; MAX_VECTORS],
                state: uapi::PCIEIPC_STATE_BOUND,
                errors: 0,
                intx_masked: false,
                resetting: false,
                users: 0,
            }),
            changed <- new_condvar!(),
            mastering <- new_mutex!(Mastering {
                retired: false,
                buffers: 0,
            }),
        })
    }

    /// Whether the device's bus mastering follows its DMA buffers: a
    /// generic device is driven by userspace through its BAR windows with
    /// the bus addresses of the DMA buffers allocated for it, so it may
    /// reach memory only while one of them exists (an open file of
    /// /dev/pcieipc alone gives it nothing to reach). The kinds the module
    /// drives keep it from probe to unbind.
    fn mastering_follows_buffers(&self) -> bool {
        self.info.kind == DeviceKind::Generic
    }

    /// A DMA buffer for this device was allocated (`true`) or is about to
    /// be freed (`false`): the first gives a generic device bus mastering,
    /// the last takes it away before its memory goes.
    pub(crate) fn buffer_changed(&self, allocated: bool) {
        let mut mastering = self.mastering.lock();
        let before = mastering.buffers;
        mastering.buffers = if allocated {
            before + 1
        } else {
            before.saturating_sub(1)
        };
        let (was, is) = (before > 0, mastering.buffers > 0);
        if self.mastering_follows_buffers() && !mastering.retired && was != is {
            pci_info::set_bus_master(&self.pdev, is);
        }
    }

    /// Clears bus mastering for good (unbind, or the device failed): the
    /// device can no longer reach memory, nor the DMA buffers about to be
    /// freed.
    fn retire(&self) {
        let mut mastering = self.mastering.lock();
        mastering.retired = true;
        pci_info::set_bus_master(&self.pdev, false);
    }

    /// Whether the device's interrupt is level-triggered INTx that the
    /// module cannot acknowledge at the device (all kinds but edu): the
    /// handler masks it (Interrupt Disable) and a waiter unmasks it, as VFIO
    /// does, so a device that keeps its line asserted cannot storm.
    fn masks_intx(&self) -> bool {
        self.info.irq_type == uapi::PCIEIPC_IRQ_INTX && self.info.kind != DeviceKind::Edu
    }

    /// Called by the hard IRQ handler of `vector`: counts the interrupt and
    /// wakes every waiter (all of them: each checks its own vector). Returns
    /// false for a shared INTx line that this device did not assert.
    pub(crate) fn interrupt(&self, vector: usize) -> bool {
        if self.masks_intx() {
            // Masked and counted under the lock a waiter unmasks under.
            let mut events = self.events.lock();
            // A line this handler masked cannot be this device's: it is
            // another device's on a shared line, or this device ignores
            // Interrupt Disable. Either way not handled here, so that the
            // kernel's spurious-interrupt detection sees a storm (as VFIO's
            // INTx handler does).
            if events.intx_masked || !pci_info::check_and_mask_intx(&self.pdev) {
                return false;
            }
            events.intx_masked = true;
            if let Some(count) = events.counts.get_mut(vector) {
                *count += 1;
            }
            drop(events);
            self.changed.notify_all();
            return true;
        }
        if self.info.kind == DeviceKind::Edu {
            let status = self.acknowledge_edu();
            // On a shared INTx line, no status bit means another device's
            // interrupt. (A message is always edu's, even one whose status a
            // previous handler already acknowledged.)
            if status == 0 && self.info.irq_type == uapi::PCIEIPC_IRQ_INTX {
                return false;
            }
            if let (true, Some(regs)) = (status & EDU_IRQ_DMA != 0, &self.regs) {
                self.edu_dma.step(regs);
            }
        }
        let mut events = self.events.lock();
        if let Some(count) = events.counts.get_mut(vector) {
            *count += 1;
        }
        drop(events);
        self.changed.notify_all();
        true
    }

    /// edu keeps its interrupt raised until the status bits are written back
    /// to its acknowledge register; returns those bits.
    fn acknowledge_edu(&self) -> u32 {
        const EDU_IRQ_STATUS: usize = 0x24;
        const EDU_IRQ_ACK: usize = 0x64;
        let Some(bar) = self.regs.as_ref().and_then(|regs| regs.try_access()) else {
            return 0;
        };
        let status = bar.try_read32(EDU_IRQ_STATUS).unwrap_or(0);
        if status != 0 {
            let _ = bar.try_write32(status, EDU_IRQ_ACK);
        }
        status
    }

    /// Runs `transfer` on the device's copy engine (edu's DMA engine, else
    /// the CPU); returns the `pcieipc_dma_engine` used.
    pub(crate) fn submit_copy(&self, transfer: Transfer) -> Result<u32> {
        match (&self.regs, self.info.kind) {
            (Some(regs), DeviceKind::Edu) => {
                let engine = EduCopyEngine {
                    engine: &self.edu_dma,
                    regs,
                };
                engine.submit(transfer)?;
                Ok(engine.kind())
            }
            _ => {
                CpuEngine.submit(transfer)?;
                Ok(CpuEngine.kind())
            }
        }
    }

    /// Marks the device gone, wakes every waiter, stops its DMA engine
    /// (waiting for a command in flight to end) and clears bus mastering.
    /// Its users' mappings are the driver's to zap, and its DMA buffers to
    /// free (`pci_driver::device_gone`).
    pub(crate) fn mark_gone(&self) {
        self.events.lock().state = uapi::PCIEIPC_STATE_GONE;
        self.changed.notify_all();
        if let Some(regs) = &self.regs {
            self.edu_dma.close(regs);
        }
        self.retire();
    }

    /// A PCI error was reported (error recovery begins) or a reset begins:
    /// waiters fail with EIO, new calls too until `thaw`; the copy in
    /// progress ends with EIO (a reset or an error loses it).
    pub(crate) fn freeze(&self) {
        let mut events = self.events.lock();
        events.errors += 1;
        if events.state == uapi::PCIEIPC_STATE_BOUND {
            events.state = uapi::PCIEIPC_STATE_FROZEN;
        }
        drop(events);
        self.changed.notify_all();
        if let Some(regs) = &self.regs {
            self.edu_dma.cancel(regs);
        }
    }

    /// A function reset begins: frozen (`freeze`), and BAR faults wait
    /// until `end_reset` (`wait_for_reset`), so that no access reaches the
    /// device while it resets; the caller zaps the BAR windows after this,
    /// so every page is faulted in again after the reset, as VFIO does.
    pub(crate) fn begin_reset(&self) {
        self.events.lock().resetting = true;
        self.freeze();
    }

    /// The function reset ended: thawed, and BAR faults go on.
    pub(crate) fn end_reset(&self) {
        self.events.lock().resetting = false;
        self.thaw();
    }

    /// Whether a function reset is in progress.
    pub(crate) fn is_resetting(&self) -> bool {
        self.events.lock().resetting
    }

    /// Sleeps until no function reset is in progress; `EINTR` on a signal.
    pub(crate) fn wait_for_reset(&self) -> Result {
        let mut events = self.events.lock();
        while events.resetting {
            if self.changed.wait_interruptible(&mut events) {
                return Err(EINTR);
            }
        }
        Ok(())
    }

    /// Sleeps until no ioctl holds the device's DMA memory (`DeviceUse`);
    /// called once the device is marked gone, so that no new one starts.
    pub(crate) fn wait_for_users(&self) {
        let mut events = self.events.lock();
        while events.users > 0 {
            self.changed.wait(&mut events);
        }
    }

    /// Error recovery resumed the device.
    pub(crate) fn thaw(&self) {
        let mut events = self.events.lock();
        if events.state == uapi::PCIEIPC_STATE_FROZEN {
            events.state = uapi::PCIEIPC_STATE_BOUND;
        }
        drop(events);
        self.changed.notify_all();
    }

    pub(crate) fn state(&self) -> u32 {
        self.events.lock().state
    }

    /// Fails with the errno of a device that cannot be used.
    pub(crate) fn check_usable(&self) -> Result {
        state_errno(self.state())
    }

    /// The counts of the device's vectors.
    pub(crate) fn counters(&self) -> [u64; MAX_VECTORS] {
        self.events.lock().counts
    }

    /// Blocks until the count of `vector` exceeds `last_seen` and returns it,
    /// or fails: `ETIMEDOUT`, `EINTR` (signal), `ENODEV` (gone), `EIO`
    /// (frozen, or a PCI error was reported during the wait). The check and
    /// the sleep happen under the lock the IRQ handler takes, so no interrupt
    /// is missed between them.
    pub(crate) fn wait(&self, vector: usize, last_seen: u64, timeout_ms: u32) -> Result<u64> {
        if vector >= self.info.num_vectors {
            return Err(EINVAL);
        }
        let mut remaining: Jiffies = if timeout_ms == uapi::PCIEIPC_WAIT_FOREVER {
            // Larger than MAX_SCHEDULE_TIMEOUT: the condvar then sleeps without a limit.
            Jiffies::MAX
        } else {
            msecs_to_jiffies(timeout_ms)
        };
        let mut events = self.events.lock();
        let errors = events.errors;
        // The waiter has seen every interrupt so far: the INTx line the
        // handler masked may fire again. One that is still asserted is an
        // interrupt at once. (A line not masked yet is the handler's: its
        // pending interrupt arrives through it.)
        if events.intx_masked
            && events.state == uapi::PCIEIPC_STATE_BOUND
            && events.counts[vector] <= last_seen
        {
            if pci_info::check_and_unmask_intx(&self.pdev) {
                events.intx_masked = false;
            } else {
                events.counts[vector] += 1;
            }
        }
        loop {
            state_errno(events.state)?;
            if events.errors != errors {
                return Err(EIO);
            }
            let count = events.counts[vector];
            if count > last_seen {
                return Ok(count);
            }
            if remaining == 0 {
                return Err(ETIMEDOUT);
            }
            remaining = match self
                .changed
                .wait_interruptible_timeout(&mut events, remaining)
            {
                CondVarTimeoutResult::Timeout => 0,
                CondVarTimeoutResult::Woken { jiffies } => jiffies,
                CondVarTimeoutResult::Signal { .. } => return Err(EINTR),
            };
        }
    }
}

fn state_errno(state: u32) -> Result {
    match state {
        uapi::PCIEIPC_STATE_BOUND => Ok(()),
        uapi::PCIEIPC_STATE_FROZEN => Err(EIO),
        _ => Err(ENODEV),
    }
}

/// An ioctl's hold on a usable device while it allocates or copies the
/// device's DMA memory: the device's removal waits for it to end
/// (`wait_for_users`), so every DMA buffer of the device (the references a
/// copy holds included) is freed before the driver's `remove` returns.
pub(crate) struct DeviceUse(Arc<BoundDevice>);

impl DeviceUse {
    /// Holds `device`, or fails with the errno of a device that cannot be
    /// used (checked under the lock that marks it gone).
    pub(crate) fn begin(device: Arc<BoundDevice>) -> Result<Self> {
        let mut events = device.events.lock();
        state_errno(events.state)?;
        events.users += 1;
        drop(events);
        Ok(DeviceUse(device))
    }

    /// The device held.
    pub(crate) fn device(&self) -> &Arc<BoundDevice> {
        &self.0
    }
}

impl core::ops::Deref for DeviceUse {
    type Target = BoundDevice;

    fn deref(&self) -> &BoundDevice {
        &self.0
    }
}

impl Drop for DeviceUse {
    fn drop(&mut self) {
        let mut events = self.0.events.lock();
        events.users -= 1;
        let last = events.users == 0;
        drop(events);
        if last {
            self.0.changed.notify_all();
        }
    }
}
