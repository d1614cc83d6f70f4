//! Memory the backend hands the GPU: device buffers that other processes
//! can open (cuMemAlloc'd, so they carry legacy IPC handles), and host
//! memory of a shared segment pinned and mapped into the GPU.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::error::CudaError;
use super::gpu::Gpu;
use crate::engine::Element;

/// Host memory this process already maps (a shared segment), pinned and
/// mapped into the GPU's address space until dropped: kernels read and
/// write it over PCIe.
pub(crate) struct HostRegistration {
    gpu: Arc<Gpu>,
    host: *mut u8,
    device: u64,
}

// SAFETY: the registration only holds addresses; the host memory belongs to
// whoever registered it, and the context is bound before every use.
unsafe impl Send for HostRegistration {}

impl HostRegistration {
    /// Registers `bytes` at `host` (page aligned) with the GPU.
    ///
    /// # Safety
    ///
    /// `host` starts `bytes` of memory mapped in this process that stay
    /// mapped until the registration is dropped.
    pub(crate) unsafe fn new(
        gpu: &Arc<Gpu>,
        host: NonNull<u8>,
        bytes: usize,
    ) -> Result<HostRegistration, CudaError> {
        gpu.bind()?;
        let host = host.as_ptr();
        // SAFETY: the caller's promise: `bytes` mapped at `host` that outlive
        // the registration, which unregisters them in drop.
        unsafe {
            sys::cuMemHostRegister_v2(
                host.cast(),
                bytes,
                sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()
        .map_err(gpu.driver("registering shared host memory with the GPU"))?;
        // Built before the next call can fail, so that a failure unregisters.
        let mut registration = HostRegistration {
            gpu: gpu.clone(),
            host,
            device: 0,
        };
        // SAFETY: `host` was just registered with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut registration.device, host.cast(), 0) }
            .result()
            .map_err(gpu.driver("mapping shared host memory into the GPU"))?;
        Ok(registration)
    }

    /// The memory's address on the GPU.
    pub(crate) fn device_address(&self) -> u64 {
        self.device
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // Queued kernels may still touch it: drain them first.
            let _ = self.gpu.synchronize();
            // SAFETY: registered in `new`, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(self.host.cast()) };
        }
    }
}

/// Host memory of this process's own, pinned (cuMemHostAlloc) so that the
/// GPU's copy engines move it at the link's rate (or, `mapped`, so that the
/// GPU reads it where it lies); freed when dropped, after the GPU's work.
pub(crate) struct PinnedHost {
    gpu: Arc<Gpu>,
    host: NonNull<u8>,
    bytes: usize,
}

impl PinnedHost {
    /// `bytes` (more than 0) of pinned host memory, contents unset.
    pub(crate) fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<PinnedHost, CudaError> {
        PinnedHost::allocate(gpu, bytes, 0)
    }

    /// `bytes` (more than 0) of pinned host memory mapped into the device's
    /// address space (DEVICEMAP), contents unset, and its address there.
    pub(crate) fn mapped(gpu: &Arc<Gpu>, bytes: usize) -> Result<(PinnedHost, u64), CudaError> {
        let pinned = PinnedHost::allocate(gpu, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP)?;
        let mut device = 0;
        // SAFETY: the memory came from cuMemHostAlloc with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, pinned.as_ptr().cast(), 0) }
            .result()
            .map_err(gpu.driver("mapping pinned host memory into the GPU"))?;
        Ok((pinned, device))
    }

    fn allocate(gpu: &Arc<Gpu>, bytes: usize, flags: u32) -> Result<PinnedHost, CudaError> {
        gpu.bind()?;
        // SAFETY: allocates; the memory is only ever handed to copies or the
        // GPU as bytes, or read through atomics, never as another typed value.
        let host = unsafe { result::malloc_host(bytes, flags) }
            .map_err(gpu.driver("allocating pinned host memory"))?;
        let host = NonNull::new(host.cast::<u8>()).ok_or(CudaError::Driver {
            ordinal: gpu.ordinal(),
            what: "allocating pinned host memory",
            source: cudarc::driver::DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY),
        })?;
        Ok(PinnedHost {
            gpu: gpu.clone(),
            host,
            bytes,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.host.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // Work queued on any stream may still use it: drain it first.
            let _ = self.gpu.synchronize();
            // SAFETY: allocated by malloc_host in `allocate`, freed once.
            let _ = unsafe { result::free_host(self.host.as_ptr().cast()) };
        }
    }
}

/// A block of device memory from cuMemAlloc, freed when the last holder
/// drops it: its buffer, and a registration that peers map (so a buffer
/// dropped while registered stays allocated, and its address cannot be
/// reused, until it is deregistered).
pub(crate) struct Allocation {
    gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
}

// SAFETY: a device address plus an owned allocation; the context it belongs
// to is bound before every use.
unsafe impl Send for Allocation {}
// SAFETY: as above; `&Allocation` only reads the address.
unsafe impl Sync for Allocation {}

impl Drop for Allocation {
    fn drop(&mut self) {
        // A failure here leaves nothing to recover: the context is going away
        // or already broken, and the driver reclaims the block with it.
        if self.gpu.bind().is_ok() {
            // Queued work that used the block is drained first.
            let _ = self.gpu.synchronize();
            // SAFETY: allocated by malloc_sync in this context, and no queued
            // work uses it any more.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// `len` elements of `T` in device memory allocated with cuMemAlloc, so that
/// its IPC handle can be opened by the other ranks (registered buffers).
pub struct DeviceBuffer<T> {
    gpu: Arc<Gpu>,
    allocation: Arc<Allocation>,
    ptr: sys::CUdeviceptr,
    len: usize,
    _element: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    /// A buffer of `len` zeroed elements on `gpu`.
    pub fn zeroed(gpu: &Arc<Gpu>, len: usize) -> Result<DeviceBuffer<T>, CudaError> {
        gpu.bind()?;
        // cuMemAlloc refuses 0 bytes; an empty buffer still owns a small block.
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        // SAFETY: a plain allocation in the bound context.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(gpu.driver("allocating device memory"))?;
        let buffer = DeviceBuffer {
            gpu: gpu.clone(),
            allocation: Arc::new(Allocation {
                gpu: gpu.clone(),
                ptr,
            }),
            ptr,
            len,
            _element: PhantomData,
        };
        // SAFETY: `bytes` bytes at `ptr` were just allocated; on the
        // collectives' stream for the reason given at copy_from_host.
        unsafe { result::memset_d8_async(ptr, 0, bytes, gpu.stream().cu_stream()) }
            .map_err(gpu.driver("zeroing device memory"))?;
        gpu.finish()?;
        Ok(buffer)
    }

    /// A buffer holding a copy of `host`.
    pub fn from_host(gpu: &Arc<Gpu>, host: &[T]) -> Result<DeviceBuffer<T>, CudaError> {
        let mut buffer = DeviceBuffer::zeroed(gpu, host.len())?;
        buffer.copy_from_host(host)?;
        Ok(buffer)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Copies `host` into the buffer (on the GPU's own stream, after the
    /// work queued there).
    pub fn copy_from_host(&mut self, host: &[T]) -> Result<(), CudaError> {
        self.check_len("host source", host.len())?;
        // SAFETY: `host` has exactly `len` elements and the allocation holds
        // them.
        unsafe { self.gpu.upload(self.ptr, host) }
    }

    /// Copies the buffer into `host` (on the GPU's own stream, after the
    /// work queued there).
    pub fn copy_to_host(&self, host: &mut [T]) -> Result<(), CudaError> {
        self.check_len("host destination", host.len())?;
        // SAFETY: as in copy_from_host.
        unsafe { self.gpu.download(self.ptr, host) }
    }

    pub fn to_host(&self) -> Result<Vec<T>, CudaError>
    where
        T: Default,
    {
        let mut host = vec![T::default(); self.len];
        self.copy_to_host(&mut host)?;
        Ok(host)
    }

    fn check_len(&self, what: &'static str, got: usize) -> Result<(), CudaError> {
        if got != self.len {
            return Err(CudaError::BufferLength {
                ordinal: self.gpu.ordinal(),
                what,
                got,
                expected: self.len,
            });
        }
        Ok(())
    }
}

impl<T> DeviceBuffer<T> {
    /// The device address of element 0 (what `GpuCall::from_raw` and other
    /// CUDA APIs take).
    pub fn address(&self) -> u64 {
        self.ptr
    }

    /// The allocation behind the buffer, to keep it alive past the buffer.
    pub(crate) fn allocation(&self) -> Arc<Allocation> {
        self.allocation.clone()
    }
}
