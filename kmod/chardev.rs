// SPDX-License-Identifier: GPL-2.0

//! `/dev/pcieipc`: one `PcieIpcFile` per open file; ioctl dispatch.

use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    prelude::*,
};

use crate::{
    bar_mmap, device_ioctls, registry,
    uapi::{self, ArgszArg},
};

/// Per-open-file state.
pub(crate) struct PcieIpcFile;

#[vtable]
impl MiscDevice for PcieIpcFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        KBox::new(PcieIpcFile, GFP_KERNEL).map_err(Into::into)
    }

    fn ioctl(_me: &PcieIpcFile, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            uapi::PCIEIPC_IOC_VERSION => version(arg),
            uapi::PCIEIPC_IOC_LIST => device_ioctls::list(arg),
            uapi::PCIEIPC_IOC_WAIT => device_ioctls::wait(arg),
            uapi::PCIEIPC_IOC_COUNTERS => device_ioctls::counters(arg),
            uapi::PCIEIPC_IOC_RING => device_ioctls::ring(arg),
            _ => Err(ENOTTY),
        }
    }

    fn mmap(_me: &PcieIpcFile, _file: &File, vma: &VmaNew) -> Result {
        bar_mmap::mmap(vma)
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
