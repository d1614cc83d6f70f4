// SPDX-License-Identifier: GPL-2.0

//! DMA_ALLOC, DMA_COPY, DMA_WAIT and the mmap of DMA buffers. Buffers and
//! tickets belong to the open file. A buffer lives in the module's table
//! (mappings.rs) and is freed when its file is released or when its device
//! goes, after its pages are zapped; a copy in flight holds its two buffers
//! itself, and the device (`DeviceUse`), whose removal waits for it: no
//! buffer outlives its device's `remove`.

use kernel::{mm::virt::VmaNew, prelude::*, sync::Arc};

use crate::{
    bound_device::DeviceUse,
    capability::{require_pci_access, require_sys_admin},
    dma_buffer::DmaBuffer,
    dma_engine::{CpuEngine, Ticket, Transfer},
    mappings::{self, DmaWindows},
    registry,
    uapi::{self, ArgszArg},
    user_mapping,
};

/// Uncollected tickets per file, at most.
const MAX_TICKETS: usize = 64;

/// The DMA state of one open file.
pub(crate) struct DmaFile {
    /// The file's id in the module's buffer table.
    file: u64,
    tickets: KVec<(u64, Arc<Ticket>)>,
    next_ticket: u64,
}

impl DmaFile {
    pub(crate) const fn new(file: u64) -> Self {
        Self {
            file,
            tickets: KVec::new(),
            next_ticket: 1,
        }
    }

    /// The file's id in the module's buffer table.
    pub(crate) fn id(&self) -> u64 {
        self.file
    }

    fn buffer(&self, handle: u32) -> Result<Arc<DmaBuffer>> {
        mappings::buffer(self.file, handle)
    }
}

/// `PCIEIPC_IOC_DMA_ALLOC`.
pub(crate) fn alloc(file: &kernel::sync::Mutex<DmaFile>, arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_dma_alloc>::read(arg)?;
    let request = arg.value;
    if request.flags != 0
        || request.size == 0
        || request.size > u64::from(uapi::PCIEIPC_DMA_MAX_SIZE)
    {
        return Err(EINVAL);
    }
    require_sys_admin()?;
    // Held until the buffer is in the table (or freed): an unbind meanwhile
    // waits, and then frees it with the device's others.
    let device = DeviceUse::begin(registry::get(request.device)?)?;
    let owner = file.lock().id();
    let buffer = DmaBuffer::alloc(device.pdev.clone(), device.index, request.size as usize)?;
    arg.value.size = buffer.size() as u64;
    arg.value.bus_addr = buffer.bus_addr();
    let handle = mappings::add_buffer(owner, device.device(), buffer)?;
    arg.value.buffer = handle;
    arg.value.mmap_offset = mappings::dma_mmap_offset(handle);
    arg.write_back()?;
    Ok(0)
}

/// `PCIEIPC_IOC_DMA_COPY`.
pub(crate) fn copy(file: &kernel::sync::Mutex<DmaFile>, arg: usize) -> Result<isize> {
    const BAR_FLAGS: u32 = uapi::PCIEIPC_DMA_SRC_BAR | uapi::PCIEIPC_DMA_DST_BAR;
    let mut arg = ArgszArg::<uapi::pcieipc_dma_copy>::read(arg)?;
    let request = arg.value;
    if request.flags & !BAR_FLAGS != 0 || request.flags == BAR_FLAGS || request.length == 0 {
        return Err(EINVAL);
    }
    require_sys_admin()?;
    // Held until the copy has dropped its buffers (a copy on edu's engine
    // hands them to the engine, which its device's removal stops first).
    let device = DeviceUse::begin(registry::get(request.device)?)?;
    let mut file = file.lock();
    if file.tickets.len() >= MAX_TICKETS {
        return Err(EBUSY);
    }
    let ticket = Ticket::new()?;
    let id = file.next_ticket;
    // Room first: once submitted, the ticket must be recorded.
    file.tickets.reserve(1, GFP_KERNEL)?;
    let engine = if request.flags == 0 {
        let src = file.buffer(request.src_buffer)?;
        let dst = file.buffer(request.dst_buffer)?;
        if src.device_index != device.index
            || dst.device_index != device.index
            || !src.contains(request.src_offset, request.length)
            || !dst.contains(request.dst_offset, request.length)
        {
            return Err(EINVAL);
        }
        device.submit_copy(Transfer {
            src,
            dst,
            src_offset: request.src_offset,
            dst_offset: request.dst_offset,
            length: request.length,
            ticket: ticket.clone(),
        })?
    } else {
        require_pci_access()?;
        let to_bar = request.flags == uapi::PCIEIPC_DMA_DST_BAR;
        let (bar, bar_offset, handle, offset) = if to_bar {
            (
                request.dst_buffer,
                request.dst_offset,
                request.src_buffer,
                request.src_offset,
            )
        } else {
            (
                request.src_buffer,
                request.src_offset,
                request.dst_buffer,
                request.dst_offset,
            )
        };
        let buffer = file.buffer(handle)?;
        let window = device
            .windows
            .get(bar as usize)
            .and_then(Option::as_ref)
            .ok_or(EINVAL)?;
        let in_bar = bar_offset
            .checked_add(request.length)
            .is_some_and(|end| end <= device.info.bars[bar as usize].size);
        if buffer.device_index != device.index || !in_bar {
            return Err(EINVAL);
        }
        CpuEngine::copy_with_bar(
            &buffer,
            offset as usize,
            window,
            bar_offset as usize,
            request.length as usize,
            to_bar,
            &ticket,
        )?
    };
    file.tickets.push((id, ticket), GFP_KERNEL)?;
    file.next_ticket += 1;
    drop(file);
    arg.value.engine = engine;
    arg.value.ticket = id;
    arg.write_back()?;
    Ok(0)
}

/// `PCIEIPC_IOC_DMA_WAIT`: the copy's own error is the ioctl's.
pub(crate) fn wait(file: &kernel::sync::Mutex<DmaFile>, arg: usize) -> Result<isize> {
    let arg = ArgszArg::<uapi::pcieipc_dma_wait>::read(arg)?;
    let request = arg.value;
    if request.flags != 0 {
        return Err(EINVAL);
    }
    let ticket = {
        let file = file.lock();
        let (_, ticket) = file
            .tickets
            .iter()
            .find(|(id, _)| *id == request.ticket)
            .ok_or(ENOENT)?;
        ticket.clone()
    };
    // Not under the file's lock: other threads may submit meanwhile.
    let result = ticket.wait(request.timeout_ms)?;
    file.lock().tickets.retain(|(id, _)| *id != request.ticket);
    result.map(|()| 0)
}

/// mmap of a DMA buffer of this file: `offset` is the VMA's file offset.
/// Needs CAP_SYS_ADMIN, as a BAR window does: a file opened by a
/// privileged process may be passed to, or kept by, one that is not.
pub(crate) fn mmap(file: &kernel::sync::Mutex<DmaFile>, vma: &VmaNew, offset: u64) -> Result {
    require_sys_admin()?;
    let (handle, in_buffer) = mappings::decode_dma_offset(offset)?;
    let owner = file.lock().id();
    mappings::check_window(owner, handle, in_buffer, (vma.end() - vma.start()) as u64)?;
    user_mapping::install_fault_handler::<DmaWindows>(vma)
}
