//! A gate on a stream: the work queued after it waits on the GPU until the
//! host opens it, so a run of calls can be queued ahead and then run back
//! to back, none of them waiting for the host to queue the next.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::{sys, CudaStream};

use super::error::CudaError;
use super::gpu::Gpu;
use super::memory::PinnedHost;

/// A word of pinned host memory a stream waits on (a stream memory
/// operation, no kernel) until the host writes it. The wait is bounded: a
/// thread opens the gate once its time is up, because a host queuing behind
/// it can block in a launch when the stream's queue is full, and would then
/// never open it. Dropping the gate opens it too, so no error path leaves a
/// stream held.
pub struct StreamGate {
    /// Tells the backstop thread the gate is open (a message or a hang-up).
    opened: Option<mpsc::Sender<()>>,
    backstop: Option<JoinHandle<()>>,
    /// Dropped last (fields drop after `drop`'s body, which joins the
    /// backstop): its drop drains the GPU, then frees the word.
    word: PinnedHost,
}

impl StreamGate {
    /// Queues on `stream` (of `gpu`'s context) a wait for this gate: what is
    /// queued after it runs once [`open`](Self::open) is called, or after
    /// `at_most`.
    pub fn hold(
        gpu: &Arc<Gpu>,
        stream: &CudaStream,
        at_most: Duration,
    ) -> Result<StreamGate, CudaError> {
        let (word, device) = PinnedHost::mapped(gpu, std::mem::size_of::<u32>())?;
        let mut gate = StreamGate {
            opened: None,
            backstop: None,
            word,
        };
        gate.shared().store(0, Ordering::Relaxed);
        // SAFETY: `device` maps the gate's word, which outlives the wait:
        // drop opens the gate, and the word's own drop drains the GPU before
        // it frees it.
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
        let address = gate.word.as_ptr() as usize;
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
        // SAFETY: the word is 4 live, page-aligned bytes of this gate's own,
        // only ever accessed atomically by the host.
        unsafe { AtomicU32::from_ptr(self.word.as_ptr().cast()) }
    }
}

impl Drop for StreamGate {
    fn drop(&mut self) {
        self.open();
        // Hanging up ends the backstop's wait; it stores to the word once
        // more, so the word is freed (after this body) only once it has ended.
        self.opened = None;
        if let Some(backstop) = self.backstop.take() {
            let _ = backstop.join();
        }
    }
}
