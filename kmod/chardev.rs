// SPDX-License-Identifier: GPL-2.0

//! `/dev/pcieipc`: one `PcieIpcFile` per open file; ioctl dispatch.

use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::Mutex,
};

use crate::{
    bar_mmap, device_ioctls,
    dma_ioctls::{self, DmaFile},
    registry,
    uapi::{self, ArgszArg},
};

/// Per-open-file state: the file's DMA buffers and tickets.
#[pin_data]
pub(crate) struct PcieIpcFile {
    #[pin]
    dma: Mutex<DmaFile>,
}

#[vtable]
impl MiscDevice for PcieIpcFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        KBox::try_pin_init(
            try_pin_init!(PcieIpcFile {
                dma <- new_mutex!(DmaFile::new()),
            }),
            GFP_KERNEL,
        )
    }

    fn ioctl(me: Pin<&PcieIpcFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            uapi::PCIEIPC_IOC_VERSION => version(arg),
            uapi::PCIEIPC_IOC_LIST => device_ioctls::list(arg),
            uapi::PCIEIPC_IOC_WAIT => device_ioctls::wait(arg),
            uapi::PCIEIPC_IOC_COUNTERS => device_ioctls::counters(arg),
            uapi::PCIEIPC_IOC_RING => device_ioctls::ring(arg),
            uapi::PCIEIPC_IOC_DMA_ALLOC => dma_ioctls::alloc(&me.dma, arg),
            uapi::PCIEIPC_IOC_DMA_COPY => dma_ioctls::copy(&me.dma, arg),
            uapi::PCIEIPC_IOC_DMA_WAIT => dma_ioctls::wait(&me.dma, arg),
            _ => Err(ENOTTY),
        }
    }

    fn mmap(me: Pin<&PcieIpcFile>, _file: &File, vma: &VmaNew) -> Result {
        let offset = bar_mmap::file_offset(vma)?;
        if offset & uapi::PCIEIPC_MMAP_DMA != 0 {
            dma_ioctls::mmap(&me.dma, vma, offset)
        } else {
            bar_mmap::mmap(vma, offset)
        }
    }
}

/// `PCIEIPC_IOC_VERSION`.
fn version(arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_version>::read(arg, size_of::<uapi::pcieipc_version>())?;
    if arg.value.flags != 0 {
        return Err(EINVAL);
    }
    let reply = &mut arg.value;
    reply.abi_major = uapi::PCIEIPC_ABI_MAJOR as u16;
    reply.abi_minor = uapi::PCIEIPC_ABI_MINOR as u16;
    reply.bound_devices = registry::bound_count();
    reply.module_version = [0; uapi::PCIEIPC_VERSION_STRING_LEN as usize];
    let version = crate::MODULE_VERSION.to_bytes();
    for (dst, &src) in reply.module_version.iter_mut().zip(version) {
        *dst = src as core::ffi::c_char;
    }
    arg.write_back()?;
    Ok(0)
}
