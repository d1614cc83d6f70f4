//! The CUDA transport's part of the trace: a span per call's kernels on the
//! GPU, timed by a pair of events around its launches and placed on the
//! host clock through one anchor event whose completion the host saw, and
//! the host hand-off's waits for its GPU.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use super::error::CudaError;
use super::gpu::Gpu;
use crate::trace::{monotonic_ns, Arg, Recorder};

/// A call's kernels, waiting for their events to be read.
struct Pending {
    name: &'static str,
    start: CudaEvent,
    end: CudaEvent,
    args: Vec<(&'static str, Arg)>,
}

/// The kernel spans of one communicator's calls.
pub(super) struct KernelSpans {
    gpu: Arc<Gpu>,
    /// An event the GPU passed at a known host time (CLOCK_MONOTONIC ns).
    anchor: Option<(CudaEvent, u64)>,
    pending: Vec<Pending>,
}

impl KernelSpans {
    pub(super) fn new(gpu: Arc<Gpu>) -> KernelSpans {
        KernelSpans {
            gpu,
            anchor: None,
            pending: Vec::new(),
        }
    }

    /// Records the start of a call's launches on `stream` (and, the first
    /// time, the anchor: recorded, waited for, and stamped on the host).
    pub(super) fn begin(&mut self, stream: &Arc<CudaStream>) -> Result<CudaEvent, CudaError> {
        if self.anchor.is_none() {
            let anchor = self.gpu.new_timing_event()?;
            anchor
                .record(stream)
                .map_err(self.gpu.driver("recording the trace's anchor"))?;
            anchor
                .synchronize()
                .map_err(self.gpu.driver("waiting for the trace's anchor"))?;
            self.anchor = Some((anchor, monotonic_ns()));
        }
        let start = self.gpu.new_timing_event()?;
        start
            .record(stream)
            .map_err(self.gpu.driver("recording a kernel span's start"))?;
        Ok(start)
    }

    /// Records the end of the launches `start` began.
    pub(super) fn end(
        &mut self,
        start: CudaEvent,
        stream: &Arc<CudaStream>,
        name: &'static str,
        args: Vec<(&'static str, Arg)>,
    ) -> Result<(), CudaError> {
        let end = self.gpu.new_timing_event()?;
        end.record(stream)
            .map_err(self.gpu.driver("recording a kernel span's end"))?;
        self.pending.push(Pending {
            name,
            start,
            end,
            args,
        });
        Ok(())
    }

    /// Waits for the GPU and turns every pending call into a span of
    /// `recorder`. Events that never ran (captured into a graph rather than
    /// launched) have no time and are left out.
    pub(super) fn resolve(&mut self, recorder: &Recorder) {
        let Some((anchor, anchor_ns)) = &self.anchor else {
            return;
        };
        let _ = self.gpu.synchronize();
        for call in self.pending.drain(..) {
            let (Ok(from_anchor), Ok(duration)) = (
                anchor.elapsed_ms(&call.start),
                call.start.elapsed_ms(&call.end),
            ) else {
                continue;
            };
            let start_ns = anchor_ns + (f64::from(from_anchor) * 1e6) as u64;
            recorder.span_between(
                call.name,
                "kernel",
                start_ns,
                start_ns + (f64::from(duration) * 1e6) as u64,
                call.args,
            );
        }
    }
}
