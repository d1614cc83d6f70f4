// SPDX-License-Identifier: GPL-2.0

//! pcieipc: PCIe peer-to-peer IPC for AllReduce.
//!
//! Registers the misc device `/dev/pcieipc`, whose ABI is `include/uapi/pcieipc.h`.

use kernel::{
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    prelude::*,
};

mod chardev;
mod events;
mod fault;
mod link;
mod pci_function;
mod poll;
mod uapi;
mod watch;

module! {
    type: PcieIpcModule,
    name: "pcieipc",
    authors: ["pcieipc developers"],
    description: "PCIe peer-to-peer IPC: BAR windows, interrupt waits, DMA, AER events, link control",
    license: "GPL",
}

/// The module version reported by `PCIEIPC_IOC_VERSION`; the userspace
/// packages carry the same version (checked by the testbed's guest test).
pub(crate) const MODULE_VERSION: &CStr = c"0.1.0";

#[pin_data(PinnedDrop)]
struct PcieIpcModule {
    #[pin]
    _chardev: MiscDeviceRegistration<chardev::PcieIpcFile>,
}

impl kernel::InPlaceModule for PcieIpcModule {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        pr_info!("pcieipc {} loaded\n", MODULE_VERSION);
        try_pin_init!(Self {
            _chardev <- MiscDeviceRegistration::register(MiscDeviceOptions {
                name: c"pcieipc",
            }),
            _: {
                fault::init()?;
            }
        })
    }
}

#[pinned_drop]
impl PinnedDrop for PcieIpcModule {
    fn drop(self: Pin<&mut Self>) {
        fault::exit();
    }
}
