// SPDX-License-Identifier: GPL-2.0

//! Copy engines behind one trait: edu's DMA engine (interrupt-driven, one
//! 4 KiB chunk per interrupt) and the CPU copy for devices without one. A
//! Linux dmaengine memcpy channel would be a third implementation.
//!
//! Every copy ends its `Ticket`, which DMA_WAIT sleeps on.

use kernel::{
    io::Io,
    new_condvar, new_spinlock_irq,
    prelude::*,
    sync::{Arc, CondVar, CondVarTimeoutResult, SpinLockIrq},
    time::{delay::fsleep, msecs_to_jiffies, Delta, Jiffies},
};

use crate::{dma_buffer::DmaBuffer, pci_info::MappedBar, uapi};

/// How a copy ended; waited on by DMA_WAIT.
#[pin_data]
pub(crate) struct Ticket {
    /// `None` while the copy runs.
    #[pin]
    result: SpinLockIrq<Option<Result>>,
    #[pin]
    ended: CondVar,
}

impl Ticket {
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                result <- new_spinlock_irq!(None),
                ended <- new_condvar!(),
            }),
            GFP_KERNEL,
        )
    }

    fn end(&self, result: Result) {
        *self.result.lock() = Some(result);
        self.ended.notify_all();
    }

    /// Sleeps until the copy ends: `Ok(result)` is the copy's own result;
    /// `Err` is ETIMEDOUT or EINTR (the copy goes on).
    pub(crate) fn wait(&self, timeout_ms: u32) -> Result<Result> {
        let mut remaining: Jiffies = if timeout_ms == uapi::PCIEIPC_WAIT_FOREVER {
            Jiffies::MAX
        } else {
            msecs_to_jiffies(timeout_ms)
        };
        let mut result = self.result.lock();
        loop {
            if let Some(result) = *result {
                return Ok(result);
            }
            if remaining == 0 {
                return Err(ETIMEDOUT);
            }
            remaining = match self
                .ended
                .wait_interruptible_timeout(&mut result, remaining)
            {
                CondVarTimeoutResult::Timeout => 0,
                CondVarTimeoutResult::Woken { jiffies } => jiffies,
                CondVarTimeoutResult::Signal { .. } => return Err(EINTR),
            };
        }
    }
}

/// One copy between two buffers of a device (ranges checked by the caller).
pub(crate) struct Transfer {
    pub(crate) src: Arc<DmaBuffer>,
    pub(crate) dst: Arc<DmaBuffer>,
    pub(crate) src_offset: u64,
    pub(crate) dst_offset: u64,
    pub(crate) length: u64,
    pub(crate) ticket: Arc<Ticket>,
}

/// Something that executes copies.
pub(crate) trait CopyEngine {
    /// `pcieipc_dma_engine`.
    fn kind(&self) -> u32;
    /// Starts (or performs) `transfer`; ends its ticket when done.
    fn submit(&self, transfer: Transfer) -> Result;
}

/// The CPU copy: done before `submit` returns.
pub(crate) struct CpuEngine;

impl CopyEngine for CpuEngine {
    fn kind(&self) -> u32 {
        uapi::PCIEIPC_ENGINE_CPU
    }

    fn submit(&self, transfer: Transfer) -> Result {
        transfer.dst.copy_from(
            transfer.dst_offset as usize,
            &transfer.src,
            transfer.src_offset as usize,
            transfer.length as usize,
        );
        transfer.ticket.end(Ok(()));
        Ok(())
    }
}

impl CpuEngine {
    /// Copies between a DMA buffer and a BAR window (which no device engine
    /// here reaches) and ends `ticket`; returns the engine used. The BAR is
    /// accessed in chunks, each under a short revocable (RCU) access, so a
    /// large copy neither stalls RCU nor outlives an unbind (ENODEV then).
    pub(crate) fn copy_with_bar(
        buffer: &DmaBuffer,
        offset: usize,
        bar: &MappedBar,
        bar_offset: usize,
        len: usize,
        to_bar: bool,
        ticket: &Ticket,
    ) -> Result<u32> {
        const CHUNK: usize = 64 << 10;
        let mut done = 0;
        while done < len {
            let chunk = (len - done).min(CHUNK);
            let io = bar.try_access().ok_or(ENODEV)?;
            buffer.copy_with_bar(offset + done, &io, bar_offset + done, chunk, to_bar)?;
            done += chunk;
        }
        ticket.end(Ok(()));
        Ok(CpuEngine.kind())
    }
}

// edu's registers (QEMU docs/specs/edu.rst).
const EDU_DMA_SRC: usize = 0x80;
const EDU_DMA_DST: usize = 0x88;
const EDU_DMA_COUNT: usize = 0x90;
const EDU_DMA_CMD: usize = 0x98;
const EDU_DMA_START: u32 = 1 << 0;
const EDU_DMA_TO_RAM: u32 = 1 << 1;
const EDU_DMA_RAISE_IRQ: u32 = 1 << 2;
/// edu's own buffer, and the most one DMA command moves.
const EDU_WINDOW: u32 = 0x40000;
const EDU_WINDOW_SIZE: u64 = 4096;
/// The interrupt status bit of a finished DMA command.
pub(crate) const EDU_IRQ_DMA: u32 = 0x100;
/// The bits of a bus address edu's DMA engine reaches (QEMU's default).
pub(crate) const EDU_DMA_BITS: u32 = 28;

/// A copy in progress on edu: each chunk goes RAM → edu's window, then
/// window → RAM, each step started by the interrupt that ends the last.
struct EduCopy {
    transfer: Transfer,
    /// Bytes already in the destination.
    done: u64,
    /// Whether the current chunk is in edu's window.
    in_window: bool,
}

impl EduCopy {
    fn chunk(&self) -> u64 {
        (self.transfer.length - self.done).min(EDU_WINDOW_SIZE)
    }

    /// Starts the next step of the copy on edu.
    fn start_step(&self, regs: &MappedBar) -> Result {
        let bar = regs.try_access().ok_or(ENODEV)?;
        let chunk = self.chunk() as u32;
        let (src, dst, cmd) = if self.in_window {
            let dst = self.transfer.dst.bus_addr() + self.transfer.dst_offset + self.done;
            (u64::from(EDU_WINDOW), dst, EDU_DMA_TO_RAM)
        } else {
            let src = self.transfer.src.bus_addr() + self.transfer.src_offset + self.done;
            (src, u64::from(EDU_WINDOW), 0)
        };
        // The DMA mask (`EDU_DMA_BITS`): bus addresses fit edu's 32-bit writes.
        bar.try_write32(src as u32, EDU_DMA_SRC)?;
        bar.try_write32(dst as u32, EDU_DMA_DST)?;
        bar.try_write32(chunk, EDU_DMA_COUNT)?;
        bar.try_write32(cmd | EDU_DMA_START | EDU_DMA_RAISE_IRQ, EDU_DMA_CMD)
    }
}

struct EduState {
    active: Option<EduCopy>,
    /// A finished copy whose buffers are dropped in process context (their
    /// `dma_free_attrs` must not run in the interrupt handler).
    retired: Option<EduCopy>,
    /// Set on unbind: no new copy starts.
    closed: bool,
}

/// edu's DMA engine: one copy at a time.
#[pin_data]
pub(crate) struct EduEngine {
    #[pin]
    state: SpinLockIrq<EduState>,
}

impl EduEngine {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            state <- new_spinlock_irq!(EduState {
                active: None,
                retired: None,
                closed: false,
            }),
        })
    }

    /// Called by the interrupt handler after an edu DMA command ended.
    pub(crate) fn step(&self, regs: &MappedBar) {
        let mut state = self.state.lock();
        let Some(copy) = state.active.as_mut() else {
            return;
        };
        if copy.in_window {
            copy.done += copy.chunk();
            copy.in_window = false;
        } else {
            copy.in_window = true;
        }
        let finished = copy.done == copy.transfer.length;
        let result = if finished {
            Ok(())
        } else {
            copy.start_step(regs)
        };
        if finished || result.is_err() {
            if let Some(copy) = state.active.take() {
                copy.transfer.ticket.end(result);
                state.retired = Some(copy);
            }
        }
    }

    /// Stops the engine for good (unbind): ends the copy in progress with
    /// ENODEV (see `end_active`); no new copy starts.
    pub(crate) fn close(&self, regs: &MappedBar) {
        self.end_active(regs, true, ENODEV);
    }

    /// A reset or a PCI error: the device forgets the copy in progress, so
    /// it ends with EIO (see `end_active`) and the next copy may start.
    pub(crate) fn cancel(&self, regs: &MappedBar) {
        self.end_active(regs, false, EIO);
    }

    /// Waits for edu to finish the DMA command in flight (it must not write
    /// into freed buffers, nor into the next copy's), ends the copy in
    /// progress with `error` and drops the buffers; `close` also refuses
    /// every later copy.
    fn end_active(&self, regs: &MappedBar, close: bool, error: Error) {
        let (active, retired) = {
            let mut state = self.state.lock();
            state.closed |= close;
            (state.active.take(), state.retired.take())
        };
        drop(retired);
        if let Some(copy) = active {
            // edu runs a command for 100 ms: allow it a second. All ones is
            // a device that no longer answers (frozen link, removed).
            for _ in 0..1000 {
                let busy = regs
                    .try_access()
                    .and_then(|bar| bar.try_read32(EDU_DMA_CMD).ok())
                    .is_some_and(|cmd| cmd != u32::MAX && cmd & EDU_DMA_START != 0);
                if !busy {
                    break;
                }
                fsleep(Delta::from_millis(1));
            }
            copy.transfer.ticket.end(Err(error));
        }
    }
}

/// `EduEngine` with the registers it drives, as a `CopyEngine`.
pub(crate) struct EduCopyEngine<'a> {
    pub(crate) engine: &'a EduEngine,
    pub(crate) regs: &'a MappedBar,
}

impl CopyEngine for EduCopyEngine<'_> {
    fn kind(&self) -> u32 {
        uapi::PCIEIPC_ENGINE_EDU
    }

    fn submit(&self, transfer: Transfer) -> Result {
        let copy = EduCopy {
            transfer,
            done: 0,
            in_window: false,
        };
        let retired = {
            let mut state = self.engine.state.lock();
            if state.closed {
                return Err(ENODEV);
            }
            if state.active.is_some() {
                return Err(EBUSY);
            }
            copy.start_step(self.regs)?;
            state.active = Some(copy);
            state.retired.take()
        };
        drop(retired);
        Ok(())
    }
}
