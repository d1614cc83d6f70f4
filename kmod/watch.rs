// SPDX-License-Identifier: GPL-2.0

//! Watches: a periodic check of a PCI function's link and config space,
//! turned into LINK_CHANGE and DEVICE_GONE events.

use kernel::{
    new_delayed_work, new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::msecs_to_jiffies,
    workqueue::{self, impl_has_delayed_work, DelayedWork, WorkItem},
};

use crate::{delayed_work, events::EventLog, link, pci_function::PciFunction, registry, uapi};

pub(crate) const MIN_PERIOD_MS: u32 = 10;
pub(crate) const MAX_PERIOD_MS: u32 = 60_000;

/// The queue a watch's periodic check runs on: short periodic housekeeping,
/// which is what the power-efficient queue is for. (`workqueue::system`'s
/// `system_wq` is marked deprecated in 7.3, and queueing on it warns.)
fn queue() -> &'static workqueue::Queue {
    workqueue::system_power_efficient()
}

struct Seen {
    link: uapi::pcieipc_link_status,
    gone: bool,
}

#[pin_data]
pub(crate) struct Watch {
    pub(crate) bdf: u32,
    function: PciFunction,
    period_ms: u32,
    events: Arc<EventLog>,
    #[pin]
    seen: Mutex<Seen>,
    /// Set by `stop`; `run` re-queues only under this lock and only while
    /// it is false, so no re-queue can slip in after `stop` set it.
    #[pin]
    stopped: Mutex<bool>,
    #[pin]
    work: DelayedWork<Watch>,
}

impl_has_delayed_work! {
    impl HasDelayedWork<Self> for Watch { self.work }
}

impl Watch {
    /// Starts watching `function` every `period_ms`.
    pub(crate) fn start(
        function: PciFunction,
        period_ms: u32,
        events: Arc<EventLog>,
    ) -> Result<Arc<Self>> {
        if !(MIN_PERIOD_MS..=MAX_PERIOD_MS).contains(&period_ms) {
            return Err(EINVAL);
        }
        let first = link::status(&function);
        let watch = Arc::pin_init(
            try_pin_init!(Watch {
                bdf: function.bdf(),
                function,
                period_ms,
                events,
                seen <- new_mutex!(Seen { link: first, gone: false }),
                stopped <- new_mutex!(false),
                work <- new_delayed_work!("pcieipc_watch"),
            }),
            GFP_KERNEL,
        )?;
        let _ = queue().enqueue_delayed(watch.clone(), msecs_to_jiffies(period_ms));
        Ok(watch)
    }

    /// Stops the watch and waits until its work item is neither queued nor
    /// running. Once `stopped` is set under its lock no run queues the item
    /// again; one queued before is run at once by the flush (and sees
    /// `stopped`), one running is waited for.
    pub(crate) fn stop(&self) {
        *self.stopped.lock() = true;
        delayed_work::flush(&self.work);
    }

    /// One check: heartbeat first (a gone device also has no link to read).
    fn check(&self) -> bool {
        let ids = self.function.config_read32(0);
        // A device this module binds reads all ones while the kernel
        // recovers it from an error or resets it (frozen): that recovery,
        // not this check, says whether it is gone (a permanent failure
        // queues DEVICE_GONE itself).
        let recovering = ids == u32::MAX
            && registry::get_bound_by_bdf(self.bdf)
                .is_ok_and(|device| device.state() == uapi::PCIEIPC_STATE_FROZEN);
        let mut seen = self.seen.lock();
        if seen.gone {
            return false;
        }
        if recovering {
            return true;
        }
        if ids == u32::MAX {
            seen.gone = true;
            let last = seen.link;
            drop(seen);
            self.events.emit(uapi::pcieipc_event {
                kind: uapi::PCIEIPC_EVENT_DEVICE_GONE,
                bdf: self.bdf,
                aer: self.function.logged_aer_regs(),
                link_before: last,
                link_after: link::status(&self.function),
                ..Default::default()
            });
            return false;
        }
        let now = link::status(&self.function);
        let changed = |s: &uapi::pcieipc_link_status| {
            (
                s.cur_speed,
                s.cur_width,
                s.state & uapi::PCIEIPC_LINK_DLL_ACTIVE,
            )
        };
        if changed(&now) != changed(&seen.link) {
            let before = seen.link;
            seen.link = now;
            drop(seen);
            self.events.emit(uapi::pcieipc_event {
                kind: uapi::PCIEIPC_EVENT_LINK_CHANGE,
                bdf: self.bdf,
                aer: self.function.logged_aer_regs(),
                link_before: before,
                link_after: now,
                ..Default::default()
            });
        }
        true
    }
}

impl WorkItem for Watch {
    type Pointer = Arc<Watch>;

    fn run(this: Arc<Watch>) {
        if *this.stopped.lock() || !this.check() {
            return;
        }
        let stopped = this.stopped.lock();
        if !*stopped {
            let period = msecs_to_jiffies(this.period_ms);
            // Queued under the lock `stop` takes (queueing does not sleep).
            let _ = queue().enqueue_delayed(this.clone(), period);
        }
    }
}
