//! Each call's end on the GPU's clock, for a per-call clock that queuing
//! does not blur. Calls queued back to back on a stream cannot be timed on
//! the host, and events between them are stamped when the stream's front end
//! reaches them: about 0.5 µs apart at best, and ranks sharing a GPU are
//! served in turn (one rank's stamp late by up to 5 µs every other call).
//! Instead a call's last kernel stamps the GPU's global timer (32 ns steps
//! on an H100) as it ends, after its last hand-over: each block of each
//! launch of the call at its end, the latest kept (`stamp_call_end` in
//! kernels/common.cu). The stamps cost a call nothing when none is asked for
//! (a null pointer the kernels test).

use std::sync::Arc;

use super::super::error::CudaError;
use super::super::gpu::Gpu;
use super::super::memory::DeviceBuffer;

/// A slot per call in device memory, taken in call order.
pub(super) struct CallEnds {
    /// The GPU's global timer (ns) as each call ended; 0 until it has.
    stamps: DeviceBuffer<i64>,
    /// The calls that took a slot so far.
    taken: usize,
}

impl CallEnds {
    /// Slots for the next `calls` calls.
    pub(super) fn new(gpu: &Arc<Gpu>, calls: usize) -> Result<CallEnds, CudaError> {
        Ok(CallEnds {
            stamps: DeviceBuffer::zeroed(gpu, calls)?,
            taken: 0,
        })
    }

    /// Where the next call's launches stamp its end (a device address);
    /// 0, no stamp, once every slot is taken.
    pub(super) fn next_call(&mut self) -> u64 {
        if self.taken == self.stamps.len() {
            return 0;
        }
        let slot = self.stamps.address() + (self.taken * std::mem::size_of::<i64>()) as u64;
        self.taken += 1;
        slot
    }

    /// The ends of the calls that took a slot, in call order (the GPU must
    /// have run them: the read is queued on its own stream only).
    pub(super) fn read(&self) -> Result<Vec<u64>, CudaError> {
        let mut stamps = self.stamps.to_host()?;
        stamps.truncate(self.taken);
        // The kernels' atomicMax treats the words as unsigned.
        Ok(stamps.into_iter().map(|stamp| stamp as u64).collect())
    }
}
