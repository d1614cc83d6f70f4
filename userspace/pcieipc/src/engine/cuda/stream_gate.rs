//! A gate on a stream: the work queued after it waits on the GPU until the
//! host opens it, so a run of calls can be queued ahead and then run back
//! to back, none of them waiting for the host to queue the next.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::{result, sys, CudaStream};

use super::error::CudaError;
use super::gpu::Gpu;

/// A word of pinned host memory a stream waits on (a stream memory
/// operation, no kernel) until the host writes it. The wait is bounded: a
/// thread opens the gate once its time is up, because a host queuing behind
/// it can block in a launch when the stream's queue is full, and would then
/// never open it. Dropping the gate opens it too, so no error path leaves a
/// stream held.
pub struct StreamGate {
    gpu: Arc<Gpu>,
    word: *mut u32,
    /// Tells the backstop thread the gate is open (a message or a hang-up).
    opened: Option<mpsc::Sender<()>>,
    backstop: Option<JoinHandle<()>>,
}

// SAFETY: the word is this gate's own pinned memory; the host only stores to
// it atomically, the GPU only reads it.
unsafe impl Send for StreamGate {}

impl StreamGate {
    /// Queues on `stream` (of `gpu`'s context) a wait for this gate: what is
    /// queued after it runs once [`open`](Self::open) is called, or after
    /// `at_most`.
    pub fn hold(
        gpu: &Arc<Gpu>,
        stream: &CudaStream,
        at_most: Duration,
    ) -> Result<StreamGate, CudaError> {
        gpu.bind()?;
        // SAFETY: a word of pinned memory mapped into the device's address
        // space (DEVICEMAP), freed in drop.
        let word = unsafe { result::malloc_host(4, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(gpu.driver("allocating a stream gate's word"))?
            .cast::<u32>();
        // Built before the calls below can fail, so that a failure frees it.
        let mut gate = StreamGate {
            gpu: gpu.clone(),
            word,
            opened: None,
            backstop: None,
        };
        gate.shared().store(0, Ordering::Relaxed);
        let mut device = 0;
        // SAFETY: `word` came from cuMemHostAlloc with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, word.cast(), 0) }
            .result()
            .map_err(gpu.driver("mapping a stream gate's word into the GPU"))?;
        // SAFETY: `device` maps the gate's word, which outlives the wait: drop
        // opens the gate before it frees the word.
        unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                device,
                1,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        }
        .result()
        .map_err(gpu.driver("queueing a wait on a stream gate"))?;
        let (opened, open_now) = mpsc::channel();
        let address = word as usize;
        gate.opened = Some(opened);
        gate.backstop = Some(std::thread::spawn(move || {
            let _ = open_now.recv_timeout(at_most);
            // SAFETY: the gate's word, freed only after drop has joined this
            // thread.
            unsafe { AtomicU32::from_ptr(address as *mut u32) }.store(1, Ordering::Release);
        }));
        Ok(gate)
    }

    /// Lets the held stream run.
    pub fn open(&self) {
        self.shared().store(1, Ordering::Release);
        if let Some(opened) = &self.opened {
            let _ = opened.send(());
        }
    }

    /// Whether the stream may run (opened here or by the backstop).
    pub fn is_open(&self) -> bool {
        self.shared().load(Ordering::Acquire) != 0
    }

    fn shared(&self) -> &AtomicU32 {
        // SAFETY: `word` is 4 live, page-aligned bytes until drop.
        unsafe { AtomicU32::from_ptr(self.word) }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.open();
        // Hanging up ends the backstop's wait; it stores to the word once
        // more, so the word is freed only after it has ended.
        self.opened = None;
        if let Some(backstop) = self.backstop.take() {
            let _ = backstop.join();
        }
        if self.gpu.bind().is_ok() {
            // The stream may not have read the open word yet: drain it first.
            let _ = self.gpu.synchronize();
            // SAFETY: allocated by malloc_host in `hold`, freed once.
            let _ = unsafe { result::free_host(self.word.cast()) };
        }
    }
}
