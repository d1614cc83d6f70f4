//! One GPU as a rank uses it: its context, the stream every collective runs
//! on, the event the host sleeps on, its compiled kernels, and the copies
//! the collectives queue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

use super::error::{driver_error, CudaError};
use super::kernels::{Kernel, KernelCache};
use crate::engine::{DType, ReduceOp};

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
        self.kernels.get(&self.ctx, self.multiprocessors, dtype, op)
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
        self.finish_stream(&self.stream, poll)
    }

    /// Waits until everything queued on `stream` (of this context) so far
    /// has run, as `finish_after_polling` does for the own stream.
    pub(crate) fn finish_stream(
        &self,
        stream: &CudaStream,
        poll: Duration,
    ) -> Result<(), CudaError> {
        self.done
            .record(stream)
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

    /// Makes `waiter` wait for the work queued on `after` so far, through
    /// `event` (nothing when they are the same stream).
    pub(crate) fn order(
        &self,
        event: &CudaEvent,
        after: &Arc<CudaStream>,
        waiter: &Arc<CudaStream>,
    ) -> Result<(), CudaError> {
        if Arc::ptr_eq(after, waiter) {
            return Ok(());
        }
        event
            .record(after)
            .map_err(self.driver("recording an ordering event"))?;
        waiter
            .wait(event)
            .map_err(self.driver("ordering one stream after another"))
    }

    /// A new event (no timing) of this GPU's context.
    pub(crate) fn new_event(&self) -> Result<CudaEvent, CudaError> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(self.driver("creating an event"))
    }

    /// An event that records when the GPU passed it, for the trace's kernel
    /// spans and the bench's per-call times (`new_event`'s skip timing).
    pub fn new_timing_event(&self) -> Result<CudaEvent, CudaError> {
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

    // Host copies go on the own stream, not the legacy default one: a
    // synchronous cuMemcpyHtoD from pageable memory may return before its DMA
    // has landed, and the collectives' non-blocking stream does not wait
    // for the default stream.

    /// Copies `host` to the device address `dst`, in order with the own
    /// stream's work, and waits for it to land.
    ///
    /// # Safety
    ///
    /// `dst` starts `host.len()` elements of `T` of device memory of this
    /// context, alive until this returns.
    pub(crate) unsafe fn upload<T>(&self, dst: u64, host: &[T]) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the caller's promise for `dst`; the driver stages pageable
        // memory before returning, and the finish below waits for the copy.
        unsafe { result::memcpy_htod_async(dst, host, self.stream.cu_stream()) }
            .map_err(self.driver("copying to the GPU"))?;
        self.finish()
    }

    /// Copies `host.len()` elements of `T` at the device address `src` into
    /// `host`, in order with the own stream's work.
    ///
    /// # Safety
    ///
    /// As `upload`, for `src`.
    pub(crate) unsafe fn download<T>(&self, src: u64, host: &mut [T]) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: as in `upload`, in the other direction; `host` is not read
        // until the finish below.
        unsafe { result::memcpy_dtoh_async(host, src, self.stream.cu_stream()) }
            .map_err(self.driver("copying from the GPU"))?;
        self.finish()
    }
}
