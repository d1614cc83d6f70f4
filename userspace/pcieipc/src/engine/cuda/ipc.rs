//! Legacy CUDA IPC: a rank exports a cuMemAlloc'd block as a 64-byte handle,
//! the handles travel over the control plane as words, and each peer opens
//! the block once and keeps the mapping until its communicator is dropped.
//!
//! Legacy handles rather than cuMem VMM allocations exported as file
//! descriptors: the handle is plain bytes, so it rides the control plane's
//! all_gather with no SCM_RIGHTS round, opening takes about 0.1 ms on the
//! H200 machine, and it needs no CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE
//! _DESCRIPTOR_SUPPORTED (absent in some virtualised GPUs). The price, a
//! cuMemAlloc per shared block, is paid once per communicator.

use std::sync::Arc;

use cudarc::driver::sys;

use super::error::CudaError;
use super::gpu::Gpu;

/// Words in an exported handle (i64: the control plane's all_gather moves
/// the engine's element types, and the bits pass through unchanged).
pub(crate) const HANDLE_WORDS: usize = 8;

/// Exports the allocation that starts at `address`.
pub(crate) fn export(gpu: &Gpu, address: u64) -> Result<[i64; HANDLE_WORDS], CudaError> {
    gpu.bind()?;
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `address` is the base of a cuMemAlloc'd block in the bound
    // context; the driver fills the 64-byte handle.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, address) }
        .result()
        .map_err(gpu.driver("exporting an IPC handle"))?;
    let mut words = [0i64; HANDLE_WORDS];
    for (word, bytes) in words.iter_mut().zip(handle.reserved.chunks_exact(8)) {
        let bytes: [u8; 8] = std::array::from_fn(|i| bytes[i] as u8);
        *word = i64::from_ne_bytes(bytes);
    }
    Ok(words)
}

/// Rank `rank`'s handle in `handles`, every rank's in rank order (as the
/// control plane's all_gather leaves them).
pub(crate) fn handle_of(handles: &[i64], rank: usize) -> &[i64; HANDLE_WORDS] {
    handles[rank * HANDLE_WORDS..][..HANDLE_WORDS]
        .try_into()
        .expect("HANDLE_WORDS words")
}

/// A peer's block opened in this process; closed on drop.
pub(crate) struct PeerMemory {
    gpu: Arc<Gpu>,
    address: u64,
}

impl PeerMemory {
    /// Opens `peer`'s block from its handle `words`, of which this rank
    /// will read and write the first `needed_bytes`. The handle comes from
    /// the peer, which may be hostile or broken: a block too small for that
    /// is refused, since the kernels and copies would go past its end.
    pub(crate) fn open(
        gpu: &Arc<Gpu>,
        peer: usize,
        words: &[i64; HANDLE_WORDS],
        needed_bytes: usize,
    ) -> Result<PeerMemory, CudaError> {
        gpu.bind()?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        for (bytes, word) in handle.reserved.chunks_exact_mut(8).zip(words) {
            for (byte, value) in bytes.iter_mut().zip(word.to_ne_bytes()) {
                *byte = value as std::ffi::c_char;
            }
        }
        let mut address = 0;
        // SAFETY: the handle came from a peer's cuIpcGetMemHandle; lazy peer
        // access maps it on another GPU too.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut address,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(gpu.driver("opening a peer's IPC handle"))?;
        // Built before the size check, so that a refusal closes the handle.
        let memory = PeerMemory {
            gpu: gpu.clone(),
            address,
        };
        let got = memory.bytes_from_address()?;
        if got < needed_bytes {
            return Err(CudaError::PeerAllocationTooSmall {
                ordinal: gpu.ordinal(),
                peer,
                got,
                needed: needed_bytes,
            });
        }
        Ok(memory)
    }

    /// Bytes of the opened allocation from `address` to its end. The driver
    /// may carve small cuMemAlloc blocks out of a larger allocation and map
    /// that whole, with `address` inside it: what this rank may touch is
    /// what lies past `address`, wherever the allocation starts.
    fn bytes_from_address(&self) -> Result<usize, CudaError> {
        let (mut base, mut size) = (0, 0);
        // SAFETY: `address` was just mapped in the bound context; the driver
        // writes the two words.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, self.address) }
            .result()
            .map_err(
                self.gpu
                    .driver("reading the size of a peer's IPC allocation"),
            )?;
        let end = base.saturating_add(size as u64);
        let past_address = if base <= self.address {
            end.saturating_sub(self.address)
        } else {
            0
        };
        Ok(usize::try_from(past_address).unwrap_or(usize::MAX))
    }

    pub(crate) fn address(&self) -> u64 {
        self.address
    }
}

impl Drop for PeerMemory {
    fn drop(&mut self) {
        // Queued work may still read the mapping: drain it first. Failures
        // leave nothing to recover (the context is broken or going away).
        if self.gpu.bind().is_ok() {
            let _ = self.gpu.finish();
            // SAFETY: opened by cuIpcOpenMemHandle in this context, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.address) };
        }
    }
}
