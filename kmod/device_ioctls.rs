// SPDX-License-Identifier: GPL-2.0

//! The ioctls on bound devices: LIST, WAIT, COUNTERS, RING.

use kernel::{
    io::Io,
    prelude::*,
    transmute::AsBytes,
    uaccess::{UserPtr, UserSlice},
};

use crate::{
    bar_mmap,
    bound_device::{BoundDevice, DeviceKind},
    capability::require_sys_admin,
    registry,
    uapi::{self, ArgszArg},
};

fn device_info(device: &BoundDevice) -> uapi::pcieipc_device_info {
    let info = &device.info;
    let mut out = uapi::pcieipc_device_info {
        index: device.index,
        state: device.state(),
        bdf: info.bdf,
        upstream_bdf: info.upstream_bdf,
        vendor: info.vendor,
        device: info.device,
        class_code: info.class_code,
        kind: info.kind.as_uapi(),
        irq_type: info.irq_type,
        num_vectors: info.num_vectors as u32,
        link_speed: info.link_speed,
        link_width: info.link_width,
        peer_id: info.peer_id,
        ..Default::default()
    };
    for (bar, (dst, src)) in out.bars.iter_mut().zip(info.bars.iter()).enumerate() {
        dst.size = src.size;
        dst.flags = src.flags;
        dst.mmap_offset = bar_mmap::mmap_offset(device.index, bar as u32);
    }
    out
}

/// `PCIEIPC_IOC_LIST`.
pub(crate) fn list(arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_list>::read(arg)?;
    let request = arg.value;
    if request.flags != 0 || request.entry_size == 0 {
        return Err(EINVAL);
    }
    // Collected first: no user memory is touched under the registry lock.
    let mut infos = KVec::<uapi::pcieipc_device_info>::new();
    registry::for_each(|device| {
        infos.push(device_info(device), GFP_KERNEL)?;
        Ok(())
    })?;
    let entry_size = request.entry_size as usize;
    let copy_len = entry_size.min(size_of::<uapi::pcieipc_device_info>());
    let written = infos.len().min(request.capacity as usize);
    for (i, info) in infos.iter().take(written).enumerate() {
        // A caller's larger entries: its extra bytes are left as they were.
        let addr = (request.entries as usize)
            .checked_add(i.checked_mul(entry_size).ok_or(EINVAL)?)
            .ok_or(EINVAL)?;
        let mut writer = UserSlice::new(UserPtr::from_addr(addr), copy_len).writer();
        writer.write_slice(&info.as_bytes()[..copy_len])?;
    }
    arg.value.count = infos.len() as u32;
    arg.write_back()?;
    Ok(0)
}

/// The device of `index`, for an ioctl that needs it usable.
fn usable_device(index: u32) -> Result<kernel::sync::Arc<BoundDevice>> {
    let device = registry::get(index)?;
    device.check_usable()?;
    Ok(device)
}

/// `PCIEIPC_IOC_WAIT`.
pub(crate) fn wait(arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_wait>::read(arg)?;
    let request = arg.value;
    if request.flags != 0 {
        return Err(EINVAL);
    }
    let device = registry::get(request.device)?;
    arg.value.count = device.wait(
        request.vector as usize,
        request.last_seen,
        request.timeout_ms,
    )?;
    arg.write_back()?;
    Ok(0)
}

/// `PCIEIPC_IOC_COUNTERS`.
pub(crate) fn counters(arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_counters>::read(arg)?;
    if arg.value.flags != 0 {
        return Err(EINVAL);
    }
    let device = registry::get(arg.value.device)?;
    arg.value.num_vectors = device.info.num_vectors as u32;
    arg.value.counts = device.counters();
    arg.write_back()?;
    Ok(0)
}

/// `PCIEIPC_IOC_RING`.
pub(crate) fn ring(arg: usize) -> Result<isize> {
    const IVSHMEM_DOORBELL: usize = 0x0c;
    let arg = ArgszArg::<uapi::pcieipc_ring>::read(arg)?;
    let request = arg.value;
    if request.flags != 0 {
        return Err(EINVAL);
    }
    require_sys_admin()?;
    let device = usable_device(request.device)?;
    if device.info.kind != DeviceKind::Ivshmem {
        return Err(EOPNOTSUPP);
    }
    let regs = device.regs.as_ref().ok_or(EOPNOTSUPP)?;
    let bar = regs.try_access().ok_or(ENODEV)?;
    let doorbell = (u32::from(request.peer) << 16) | u32::from(request.vector);
    bar.try_write32(doorbell, IVSHMEM_DOORBELL)?;
    Ok(0)
}
