//! One GPU as a rank uses it: its context, the stream every collective runs
//! on, the event the host sleeps on, and device buffers that other processes
//! can open (cuMemAlloc'd, so they carry legacy IPC handles).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

use super::kernels::{Kernel, KernelCache};
use crate::engine::{DType, Element, ReduceOp};

/// A CUDA failure, with the GPU and the step it concerns.
/// The name this backend's errors carry.
pub const BACKEND: &str = "cuda";

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("the CUDA {library} library is not installed (searched the loader path: set LD_LIBRARY_PATH to the directory holding it)")]
    LibraryMissing { library: &'static str },

    #[error("GPU {ordinal}: {what}: {source}")]
    Driver {
        ordinal: usize,
        what: &'static str,
        #[source]
        source: DriverError,
    },

    #[error("GPU {ordinal}: compiling the reduce kernels with NVRTC: {log}")]
    Compile { ordinal: usize, log: String },

    #[error("this communicator hands over on the host (ranks share a GPU, or the host hand-off was asked for): stream-ordered calls need the GPU hand-off")]
    NoGpuHandoff,

    #[error("the control plane's segment has no backend area of {bytes} bytes per rank for the GPU hand-off through host memory (its transport keeps its windows in device memory, or rank 0 asked for none)")]
    NoHostExchange { bytes: usize },

    #[error("GPU {ordinal}: stream {stream:#x} belongs to another CUDA context than this GPU's primary one")]
    ForeignStream { ordinal: usize, stream: usize },

    #[error("GPU {ordinal}: {what} of {got} elements, expected {expected}")]
    BufferLength {
        ordinal: usize,
        what: &'static str,
        got: usize,
        expected: usize,
    },
}

/// Turns a driver error on GPU `ordinal` during `what` into a `CudaError`.
pub(crate) fn driver_error(
    ordinal: usize,
    what: &'static str,
) -> impl FnOnce(DriverError) -> CudaError {
    move |source| CudaError::Driver {
        ordinal,
        what,
        source,
    }
}

/// Whether libcuda and libnvrtc can be loaded; cudarc would panic on first use.
fn check_libraries() -> Result<(), CudaError> {
    // SAFETY: both only try to dlopen candidate names and drop the handle.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::LibraryMissing {
            library: "driver (libcuda)",
        });
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::LibraryMissing {
            library: "NVRTC (libnvrtc)",
        });
    }
    Ok(())
}

/// A GPU opened by this process. Communicators on the same GPU share it (and
/// its compiled kernels); the context lives as long as any of them.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Recorded after a step's work; the host sleeps in its synchronize
    /// (CU_EVENT_BLOCKING_SYNC) instead of spinning on the GPU.
    done: CudaEvent,
    kernels: KernelCache,
    multiprocessors: u32,
    context_time: Duration,
}

impl Gpu {
    /// Opens GPU `ordinal`'s primary context. This is the expensive part of
    /// joining (100–250 ms per process), reported apart from a communicator's
    /// init time.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        check_libraries()?;
        let started = Instant::now();
        let driver = |what| driver_error(ordinal, what);
        let ctx = CudaContext::new(ordinal).map_err(driver("creating the context"))?;
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let done = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver("creating the completion event"))?;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("reading the multiprocessor count"))?;
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            done,
            kernels: KernelCache::default(),
            multiprocessors: multiprocessors.max(1) as u32,
            context_time: started.elapsed(),
        }))
    }

    /// How many GPUs this process sees.
    pub fn count() -> Result<usize, CudaError> {
        check_libraries()?;
        let driver = |what| driver_error(0, what);
        result::init().map_err(driver("initialising the driver"))?;
        let count = result::device::get_count().map_err(driver("counting GPUs"))?;
        Ok(count.max(0) as usize)
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// How long creating the context took.
    pub fn context_time(&self) -> Duration {
        self.context_time
    }

    /// Free and total device memory in bytes (cuMemGetInfo).
    pub fn memory_info(&self) -> Result<(usize, usize), CudaError> {
        self.ctx
            .mem_get_info()
            .map_err(self.driver("reading free memory"))
    }

    pub(crate) fn driver(&self, what: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        driver_error(self.ordinal(), what)
    }

    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(self.driver("binding the context"))
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream the blocking calls use (calls queued on it by the
    /// stream-ordered API run in order with them).
    pub fn stream_handle(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }

    pub(crate) fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// The kernels of `dtype` and `op`, compiled by NVRTC on first use and
    /// kept for the process's lifetime.
    pub(crate) fn kernel(&self, dtype: DType, op: ReduceOp) -> Result<Arc<Kernel>, CudaError> {
        self.kernels.get(&self.ctx, dtype, op)
    }

    /// Waits, asleep, until everything queued on the stream so far has run.
    pub(crate) fn finish(&self) -> Result<(), CudaError> {
        self.finish_after_polling(Duration::ZERO)
    }

    /// Waits until everything queued on the stream so far has run: polls the
    /// event for up to `poll`, then sleeps in its synchronize. A blocking-sync
    /// wake-up costs 100–300 µs on a virtualised GPU, several times a small
    /// step's GPU time, so short waits are polled; long ones still sleep.
    pub(crate) fn finish_after_polling(&self, poll: Duration) -> Result<(), CudaError> {
        self.done
            .record(&self.stream)
            .map_err(self.driver("recording the completion event"))?;
        let started = Instant::now();
        while started.elapsed() < poll {
            if self
                .done
                .try_is_complete()
                .map_err(self.driver("polling the completion event"))?
            {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        self.done
            .synchronize()
            .map_err(self.driver("waiting for the GPU"))
    }

    /// A stream another library made in this GPU's primary context (torch's
    /// current stream, say), for stream-ordered calls queued in order with
    /// that library's work; dropping the wrapper leaves the stream alone.
    /// Refused when the stream belongs to another context. 0 is the legacy
    /// default stream.
    ///
    /// # Safety
    ///
    /// `handle` is a live CUstream, kept alive by its owner while the
    /// returned wrapper (and any call queued on it) may use it.
    pub unsafe fn borrow_stream(&self, handle: usize) -> Result<Arc<CudaStream>, CudaError> {
        self.bind()?;
        let stream = handle as sys::CUstream;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller's promise that `handle` is a live stream; the
        // driver writes the stream's context into `context`.
        unsafe { sys::cuStreamGetCtx(stream, &mut context) }
            .result()
            .map_err(self.driver("reading the stream's context"))?;
        if context != self.ctx.cu_ctx() {
            return Err(CudaError::ForeignStream {
                ordinal: self.ordinal(),
                stream: handle,
            });
        }
        // SAFETY: `stream` belongs to this context (checked) and its owner
        // keeps it alive (the caller's promise).
        Ok(unsafe { self.ctx.wrap_borrowed_stream(stream) })
    }

    /// A new stream of this GPU's context, for stream-ordered calls.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>, CudaError> {
        self.ctx
            .new_stream()
            .map_err(self.driver("creating a stream"))
    }

    /// Waits until everything queued on any stream of this context has run.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx
            .synchronize()
            .map_err(self.driver("waiting for every stream"))
    }

    /// A new event (no timing) of this GPU's context.
    pub(crate) fn new_event(&self) -> Result<CudaEvent, CudaError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(self.driver("creating an event"))
    }

    /// An event that records when the GPU passed it, for the trace's kernel
    /// spans (`new_event`'s skip timing).
    pub(crate) fn new_timing_event(&self) -> Result<CudaEvent, CudaError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(self.driver("creating a timing event"))
    }

    /// The PCI address of the GPU (domain, bus, device) as one number: two
    /// ranks on the same GPU have the same, whatever their ordinals.
    pub(crate) fn pci_address(&self) -> Result<i64, CudaError> {
        let attribute = |attribute, what| {
            self.ctx
                .attribute(attribute)
                .map(i64::from)
                .map_err(self.driver(what))
        };
        use sys::CUdevice_attribute::*;
        let domain = attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, "reading the PCI domain")?;
        let bus = attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "reading the PCI bus")?;
        let device = attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, "reading the PCI device")?;
        Ok((domain << 16) | (bus << 8) | device)
    }

    /// Queues a copy of `bytes` bytes between device addresses (either may be
    /// a peer's IPC mapping: the copy engine moves it peer to peer).
    pub(crate) fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: callers pass ranges inside live allocations (own buffers or
        // open peer mappings) that no host code touches while the stream runs.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(self.driver("queueing a device copy"))
    }
}

/// What the hand-off kernels report a failure in: pinned host memory the
/// GPU writes (mapped into the device's address space) and the host reads
/// without a copy. `word` is 0 or the failure; for a mismatched call,
/// `calls` holds the peer's call and this rank's (two words each) and is
/// written before `word`.
#[repr(C)]
struct Report {
    word: u32,
    _pad: u32,
    calls: [u64; 4],
}

pub(crate) struct FailureReport {
    gpu: Arc<Gpu>,
    host: *mut Report,
    device: u64,
}

// SAFETY: the report is process-wide pinned memory that the host touches only
// through volatile reads and writes of whole words (`read`, `raise`,
// `calls`); the GPU writes it too, and any value it holds is valid.
unsafe impl Send for FailureReport {}
// SAFETY: as above.
unsafe impl Sync for FailureReport {}

impl FailureReport {
    /// A zeroed report.
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<FailureReport, CudaError> {
        gpu.bind()?;
        // SAFETY: a report's bytes of pinned memory, mapped into every
        // context (DEVICEMAP, PORTABLE).
        let host = unsafe {
            result::malloc_host(
                std::mem::size_of::<Report>(),
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }
        .map_err(gpu.driver("allocating the host-mapped failure report"))?
        .cast::<Report>();
        // SAFETY: `host` is fresh, writable memory aligned for any type
        // (cuMemHostAlloc returns page-aligned memory).
        unsafe {
            host.write_volatile(Report {
                word: 0,
                _pad: 0,
                calls: [0; 4],
            })
        };
        let mut device = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }.result();
        let report = FailureReport {
            gpu: gpu.clone(),
            host,
            device,
        };
        mapped.map_err(gpu.driver("mapping the failure report into the GPU"))?;
        Ok(report)
    }

    /// The failure word's address on the GPU.
    pub(crate) fn device_address(&self) -> u64 {
        self.device
    }

    /// The calls' address on the GPU.
    pub(crate) fn calls_device_address(&self) -> u64 {
        self.device + std::mem::offset_of!(Report, calls) as u64
    }

    /// Sets the word from the host (a failure the kernels then see).
    pub(crate) fn raise(&self, word: u32) {
        // SAFETY: as in `read`; a whole-word volatile store.
        unsafe { (&raw mut (*self.host).word).write_volatile(word) };
    }

    pub(crate) fn read(&self) -> u32 {
        // SAFETY: `host` is live pinned memory (freed only in drop) that the
        // GPU may write at any time: read it volatile.
        unsafe { (&raw const (*self.host).word).read_volatile() }
    }

    /// The mismatched calls (the peer's, then this rank's), once `read`
    /// has returned a mismatch: the kernel writes them before the word.
    pub(crate) fn calls(&self) -> [u64; 4] {
        // SAFETY: as in `read`; whole aligned words.
        std::array::from_fn(|i| unsafe {
            (&raw const (*self.host).calls)
                .cast::<u64>()
                .add(i)
                .read_volatile()
        })
    }
}

impl Drop for FailureReport {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // Queued work may still write it: drain it first.
            let _ = self.gpu.finish();
            // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
            let _ = unsafe { result::free_host(self.host.cast()) };
        }
    }
}

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

    // Copies go on the communicator's stream, not the legacy default one: a
    // synchronous cuMemcpyHtoD from pageable memory may return before its DMA
    // has landed, and the collectives' non-blocking stream does not wait
    // for the default stream.
    pub fn copy_from_host(&mut self, host: &[T]) -> Result<(), CudaError> {
        self.check_len("host source", host.len())?;
        self.gpu.bind()?;
        // SAFETY: `host` has exactly `len` elements and the allocation holds
        // them; the driver stages pageable memory before returning, and the
        // finish below waits for the copy to land.
        unsafe { result::memcpy_htod_async(self.ptr, host, self.gpu.stream().cu_stream()) }
            .map_err(self.gpu.driver("copying to the GPU"))?;
        self.gpu.finish()
    }

    pub fn copy_to_host(&self, host: &mut [T]) -> Result<(), CudaError> {
        self.check_len("host destination", host.len())?;
        self.gpu.bind()?;
        // SAFETY: as in copy_from_host, in the other direction; `host` is
        // not read until the finish below.
        unsafe { result::memcpy_dtoh_async(host, self.ptr, self.gpu.stream().cu_stream()) }
            .map_err(self.gpu.driver("copying from the GPU"))?;
        self.gpu.finish()
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
    /// The device address of element 0 (what `all_reduce_raw` and other
    /// CUDA APIs take).
    pub fn address(&self) -> u64 {
        self.ptr
    }

    /// The allocation behind the buffer, to keep it alive past the buffer.
    pub(crate) fn allocation(&self) -> Arc<Allocation> {
        self.allocation.clone()
    }
}
