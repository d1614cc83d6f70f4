// SPDX-License-Identifier: GPL-2.0

//! The PCI driver: binds ivshmem-doorbell and edu through its ID table, and
//! any device handed to it through `new_id` or `driver_override` (a generic
//! device: BARs and interrupts, CPU copies).
//!
//! Probe enables memory space and bus mastering (a generic device's only
//! while /dev/pcieipc is open), maps the register BAR of the
//! kinds the module drives, allocates interrupt vectors with a counting
//! handler on each, and publishes the device in the registry; unbind marks it
//! gone, which wakes its waiters with `ENODEV`, clears bus mastering, zaps
//! its BAR windows and frees its DMA buffers. Its PCI error handlers are in recovery.rs. A device
//! in a PCI domain above 0xffff is refused: `PCIEIPC_BDF` cannot name it.

use kernel::{
    device::{Bound, Core},
    io::Io,
    irq::{self, IrqReturn},
    pci,
    prelude::*,
    sync::Arc,
};

use crate::{
    bar_mmap,
    bar_regions::BarRegions,
    bound_device::{BoundDevice, DeviceInfo, DeviceKind, MAX_VECTORS},
    dma_engine::EDU_DMA_BITS,
    fault,
    irq_vectors::IrqVectors,
    link, mappings,
    pci_function::PciFunction,
    pci_info::{self, MappedBar},
    registry, uapi,
};

pub(crate) struct PcieIpcDriver;

// No per-entry data: every entry's driver_data stays 0, which is what
// `new_id` must then be given (the default), so an administrator can hand
// the module any device; probe tells the kinds apart by their IDs.
kernel::pci_device_table!(
    PCI_TABLE,
    @none,
    [
        pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110),
        // QEMU's edu: its vendor is not one `pci::Vendor` names.
        pci_info::device_id(0x1234, 0x11e8),
    ]
);

/// The hard IRQ handler of one vector.
pub(crate) struct VectorHandler {
    device: Arc<BoundDevice>,
    vector: usize,
}

impl irq::Handler for VectorHandler {
    fn handle(&self) -> IrqReturn {
        if self.device.interrupt(self.vector) {
            IrqReturn::Handled
        } else {
            IrqReturn::None
        }
    }
}

pub(crate) struct DriverData<'bound> {
    device: Arc<BoundDevice>,
    _irqs: Option<IrqVectors<'bound, VectorHandler>>,
    _regions: BarRegions<'bound>,
}

impl pci::Driver for PcieIpcDriver {
    type IdInfo = ();
    type Data<'bound> = DriverData<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        let vendor = pdev.vendor_id().as_raw();
        let kind = DeviceKind::from_ids(vendor, pdev.device_id());
        let Some(bdf) = pci_info::bdf(pdev) else {
            dev_err!(
                pdev,
                "pcieipc: PCI domain above 0xffff: PCIEIPC_BDF cannot name this device\n"
            );
            return Err(EOPNOTSUPP);
        };
        pdev.enable_device_mem()?;
        // A generic device masters the bus only while a DMA buffer allocated
        // for it exists (`BoundDevice::buffer_changed`).
        if kind != DeviceKind::Generic {
            pdev.set_master();
        }
        if kind == DeviceKind::Edu {
            // edu's DMA engine reaches 28 bits (QEMU's edu masks every DMA
            // address with its dma_mask property, 2^28 - 1 by default, and
            // the guest cannot read the property): a buffer above 256 MiB
            // would have edu copy to the wrong memory.
            // SAFETY: no DMA allocation or mapping exists yet for this device.
            unsafe {
                kernel::dma::Device::dma_set_mask_and_coherent(
                    pdev,
                    kernel::dma::DmaMask::new::<EDU_DMA_BITS>(),
                )
            }?;
        }
        let bound: &'bound pci::Device<Bound> = pdev;
        let regs: Option<MappedBar> = match kind {
            DeviceKind::Generic => None,
            DeviceKind::Ivshmem | DeviceKind::Edu => {
                Some(bound.iomap_region(0, c"pcieipc")?.into_devres()?)
            }
        };
        // A device handed over through driver_override may have no
        // interrupt at all: it is still bound, with no vectors to wait on.
        let mut irqs = match IrqVectors::allocate(bound, MAX_VECTORS as u32) {
            Ok(irqs) => Some(irqs),
            Err(e) if kind == DeviceKind::Generic => {
                dev_info!(pdev, "pcieipc: no interrupt vectors ({:?})\n", e);
                None
            }
            Err(e) => return Err(e),
        };
        let peer_id = match (kind, &regs) {
            (DeviceKind::Ivshmem, Some(regs)) => {
                const IVSHMEM_IVPOSITION: usize = 0x08;
                regs.access(bound.as_ref())?
                    .try_read32(IVSHMEM_IVPOSITION)?
            }
            _ => uapi::PCIEIPC_NO_PEER_ID,
        };
        // The link above the device, read as PCIEIPC_IOC_LINK_STATUS reads it.
        let link = link::status(&PciFunction::find(bdf)?);
        let register_bar = regs.as_ref().map(|_| 0);
        let device_info = DeviceInfo {
            bdf,
            upstream_bdf: link.upstream_bdf,
            vendor,
            device: pdev.device_id(),
            class_code: pdev.pci_class().as_raw(),
            kind,
            irq_type: irqs
                .as_ref()
                .map_or(uapi::PCIEIPC_IRQ_NONE, |irqs| irqs.irq_type()),
            num_vectors: irqs.as_ref().map_or(0, |irqs| irqs.len()),
            link_speed: link.cur_speed.into(),
            link_width: link.cur_width.into(),
            peer_id,
            bars: pci_info::bars(bound, register_bar),
        };
        // The BAR windows that copies reach (mapping requests them); the
        // other memory BARs are only requested.
        let mut windows: [Option<MappedBar>; uapi::PCIEIPC_NUM_BARS as usize] = Default::default();
        for (index, bar) in device_info.bars.iter().enumerate() {
            if bar.flags & uapi::PCIEIPC_BAR_MMAP != 0
                && bar.size <= u64::from(uapi::PCIEIPC_DMA_BAR_MAX_SIZE)
            {
                windows[index] = Some(
                    bound
                        .iomap_region(index as u32, c"pcieipc")?
                        .into_devres()?,
                );
            }
        }
        let regions = BarRegions::request(bound, &device_info.bars, |index| {
            register_bar == Some(index) || windows[index].is_some()
        })?;
        let device = Arc::pin_init(
            BoundDevice::new(
                registry::next_index(),
                device_info,
                bound.into(),
                regs,
                windows,
            ),
            GFP_KERNEL,
        )?;
        if let Some(irqs) = irqs.as_mut() {
            irqs.request_all(|vector| VectorHandler {
                device: device.clone(),
                vector,
            })?;
        }
        registry::add(device.clone())?;
        dev_info!(
            pdev,
            "pcieipc: device {} bound ({} interrupt vectors)\n",
            device.index,
            device.info.num_vectors
        );
        Ok(DriverData {
            device,
            _irqs: irqs,
            _regions: regions,
        })
    }

    fn unbind<'bound>(_pdev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>) {
        device_gone(&this.device);
    }
}

/// Queues DEVICE_GONE, then marks `device` gone (its waiters fail with
/// ENODEV, its DMA engine stops, bus mastering is cleared), waits for the
/// ioctls that hold its DMA memory (`DeviceUse`), zaps its BAR
/// windows in every process, and frees its DMA buffers after zapping their
/// mappings: nothing of the device stays reachable from userspace, and its
/// memory is freed while the device is still bound. A process that touches
/// one of those windows again gets the module's blank page
/// (`mappings::stand_in`), never a signal; the event comes first, so a
/// process that read through the blank page finds the event when it next
/// reads the event stream. Unbind (hot-unplug, module unload) and a
/// permanent PCI error both end here; the second time does nothing.
pub(crate) fn device_gone(device: &BoundDevice) {
    if device.state() == uapi::PCIEIPC_STATE_GONE {
        return;
    }
    fault::device_removed(device.info.bdf);
    device.mark_gone();
    // An allocation or copy in flight holds DMA buffers of the device.
    device.wait_for_users();
    bar_mmap::zap_device(device.index);
    mappings::device_gone(device.index);
}
