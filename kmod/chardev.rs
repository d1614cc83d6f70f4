// SPDX-License-Identifier: GPL-2.0

//! `/dev/pcieipc`: one `PcieIpcFile` per open file; ioctl dispatch.

use kernel::{
    fs::{File, Kiocb},
    iov::IovIterDest,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{poll::PollCondVar, Arc, Mutex},
    transmute::AsBytes,
};

use crate::{
    bar_mmap, device_ioctls,
    dma_ioctls::{self, DmaFile},
    fault::{self, FaultState},
    mappings,
    poll::{self, Poll},
    registry,
    uapi::{self, ArgszArg},
    user_mapping,
};

/// The module version reported by `PCIEIPC_IOC_VERSION`; the userspace
/// packages carry the same version (checked by the testbed's guest test).
pub(crate) const MODULE_VERSION: &CStr = c"0.1.0";

/// Per-open-file state: the file's DMA buffers and tickets, and its cursor
/// in the event log.
#[pin_data]
pub(crate) struct PcieIpcFile {
    #[pin]
    dma: Mutex<DmaFile>,
    fault: Arc<FaultState>,
    /// Sequence number of the next event this file reads.
    #[pin]
    event_cursor: Mutex<u64>,
}

impl Poll for PcieIpcFile {
    fn poll_condvar(&self) -> &PollCondVar {
        self.fault.events.poll_condvar()
    }

    /// Whether this file's cursor has events to read.
    fn readable(&self) -> bool {
        let cursor = *self.event_cursor.lock();
        self.fault.events.readable_at(cursor)
    }
}

#[vtable]
impl MiscDevice for PcieIpcFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let fault = fault::state()?;
        let cursor = fault.events.first_cursor();
        let id = mappings::attach(file)?;
        let me = KBox::pin_init(
            try_pin_init!(PcieIpcFile {
                dma <- new_mutex!(DmaFile::new(id)),
                fault,
                event_cursor <- new_mutex!(cursor),
            }),
            GFP_KERNEL,
        )?;
        poll::install::<Self>(file);
        Ok(me)
    }

    fn release(me: Pin<KBox<Self>>, file: &File) {
        mappings::release(file, me.dma.lock().id());
    }

    fn ioctl(me: Pin<&PcieIpcFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            uapi::PCIEIPC_IOC_VERSION => version(&me.fault, arg),
            uapi::PCIEIPC_IOC_LIST => device_ioctls::list(arg),
            uapi::PCIEIPC_IOC_WAIT => device_ioctls::wait(arg),
            uapi::PCIEIPC_IOC_COUNTERS => device_ioctls::counters(arg),
            uapi::PCIEIPC_IOC_RING => device_ioctls::ring(arg),
            uapi::PCIEIPC_IOC_DMA_ALLOC => dma_ioctls::alloc(&me.dma, arg),
            uapi::PCIEIPC_IOC_DMA_COPY => dma_ioctls::copy(&me.dma, arg),
            uapi::PCIEIPC_IOC_DMA_WAIT => dma_ioctls::wait(&me.dma, arg),
            uapi::PCIEIPC_IOC_LINK_STATUS => fault::link_status(arg),
            uapi::PCIEIPC_IOC_LINK_RETRAIN => fault::link_retrain(&me.fault, arg),
            uapi::PCIEIPC_IOC_WATCH => fault::watch(&me.fault, arg),
            uapi::PCIEIPC_IOC_RESET => fault::reset(&me.fault, arg),
            _ => Err(ENOTTY),
        }
    }

    fn mmap(me: Pin<&PcieIpcFile>, _file: &File, vma: &VmaNew) -> Result {
        let offset = user_mapping::file_offset(vma)?;
        if offset & uapi::PCIEIPC_MMAP_DMA != 0 {
            dma_ioctls::mmap(&me.dma, vma, offset)
        } else {
            bar_mmap::mmap(vma, offset)
        }
    }

    /// Whole `pcieipc_event` records; see the header.
    fn read_iter(kiocb: Kiocb<'_, Self::Ptr>, iov: &mut IovIterDest<'_>) -> Result<usize> {
        let record = size_of::<uapi::pcieipc_event>();
        let max = iov.len() / record;
        if max == 0 {
            return Err(EINVAL);
        }
        let nonblocking = poll::nonblocking(&kiocb);
        let me = kiocb.file();
        // Sleep without the cursor's lock: poll and other readers of this
        // file must not queue behind a reader waiting for events.
        let (mut cursor, events) = loop {
            let mut cursor = me.event_cursor.lock();
            match me.fault.events.take(&mut cursor, max) {
                Ok(events) => break (cursor, events),
                Err(e) if e == EAGAIN && !nonblocking => {
                    let at = *cursor;
                    drop(cursor);
                    me.fault.events.wait_readable(at)?;
                }
                Err(e) => return Err(e),
            }
        };
        let mut copied = 0;
        for event in events.iter() {
            if iov.copy_to_iter(event.as_bytes()) != record {
                // The user buffer faulted: this record and the ones after it
                // stay unread (an overflow record's seq is where it started).
                *cursor = event.seq;
                break;
            }
            copied += record;
        }
        if copied == 0 {
            return Err(EFAULT);
        }
        Ok(copied)
    }
}

/// `PCIEIPC_IOC_VERSION`.
fn version(fault: &FaultState, arg: usize) -> Result<isize> {
    let mut arg = ArgszArg::<uapi::pcieipc_version>::read(arg)?;
    if arg.value.flags != 0 {
        return Err(EINVAL);
    }
    let reply = &mut arg.value;
    reply.abi_major = uapi::PCIEIPC_ABI_MAJOR as u16;
    reply.abi_minor = uapi::PCIEIPC_ABI_MINOR as u16;
    reply.bound_devices = registry::bound_count();
    reply.events_emitted = fault.events.emitted();
    reply.module_version = [0; uapi::PCIEIPC_VERSION_STRING_LEN as usize];
    let version = MODULE_VERSION.to_bytes();
    for (dst, &src) in reply.module_version.iter_mut().zip(version) {
        *dst = src as core::ffi::c_char;
    }
    arg.write_back()?;
    Ok(0)
}
