// SPDX-License-Identifier: GPL-2.0

//! pcieipc: PCIe peer-to-peer IPC for AllReduce.
//!
//! Registers the misc device `/dev/pcieipc`, whose ABI is `include/uapi/pcieipc.h`.

use kernel::{
    driver,
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    prelude::*,
};

mod aer;
mod bar_mmap;
mod bar_regions;
mod bound_device;
mod capability;
mod chardev;
mod delayed_work;
mod device_ioctls;
mod dma_buffer;
mod dma_engine;
mod dma_ioctls;
mod events;
mod fault;
mod irq_vectors;
mod link;
mod link_control;
mod mappings;
mod pci_driver;
mod pci_function;
mod pci_info;
mod poll;
mod recovery;
mod registry;
mod retrain_sequence;
mod text_param;
mod uapi;
mod user_mapping;
mod watch;

module! {
    type: PcieIpcModule,
    name: "pcieipc",
    authors: ["pcieipc developers"],
    description: "PCIe peer-to-peer IPC: BAR windows, interrupt waits, DMA, AER events, link control",
    license: "GPL",
}

#[pin_data(PinnedDrop)]
struct PcieIpcModule {
    #[pin]
    _chardev: MiscDeviceRegistration<chardev::PcieIpcFile>,
    /// Declared last, so unregistered (every device unbound) last.
    #[pin]
    _driver: driver::Registration<aer::AerAdapter<pci_driver::PcieIpcDriver>>,
}

impl kernel::InPlaceModule for PcieIpcModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        pr_info!("pcieipc {} loaded\n", chardev::MODULE_VERSION);
        // SAFETY: called once, before the driver and the misc device exist.
        unsafe { registry::init() };
        // Before the misc device: opening it needs the address space its
        // files map through, and the event log.
        // SAFETY: as above.
        let mappings = unsafe { mappings::init() };
        // SAFETY: as above.
        let fault_state = unsafe { fault::init() };
        try_pin_init!(Self {
            _: {
                mappings?;
                fault_state?;
            },
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
        // The module unloads only when no file is open, so nothing is mapped.
        mappings::exit();
        fault::exit();
    }
}
