// SPDX-License-Identifier: GPL-2.0

//! pcieipc: PCIe peer-to-peer IPC for AllReduce.
//!
//! Registers the misc device `/dev/pcieipc`, whose ABI is `include/uapi/pcieipc.h`.

use kernel::{
    driver,
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    pci,
    prelude::*,
};

mod bar_mmap;
mod bar_regions;
mod bound_device;
mod chardev;
mod device_ioctls;
mod dma_buffer;
mod dma_engine;
mod dma_ioctls;
mod error_handlers;
mod irq_vectors;
mod pci_driver;
mod pci_info;
mod registry;
mod uapi;

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
    /// Declared last, so unregistered (every device unbound) last.
    #[pin]
    _driver: driver::Registration<pci::Adapter<pci_driver::PcieIpcDriver>>,
}

impl kernel::InPlaceModule for PcieIpcModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        pr_info!("pcieipc {} loaded\n", MODULE_VERSION);
        // SAFETY: called once, before the driver and the misc device exist.
        unsafe { registry::init() };
        // SAFETY: as above.
        unsafe { bar_mmap::init() };
        try_pin_init!(Self {
            _chardev <- MiscDeviceRegistration::register(MiscDeviceOptions {
                name: c"pcieipc",
            }),
            _driver <- driver::Registration::new(c"pcieipc", module),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for PcieIpcModule {
    fn drop(self: Pin<&mut Self>) {
        // The module unloads only when no file is open, so no BAR window is
        // left to zap: the device nodes' inodes can go.
        bar_mmap::release_inodes();
    }
}
