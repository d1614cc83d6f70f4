//! The CUDA transport's part of the trace: a span per call's kernels on the
//! GPU, and through host memory by the copy engines a span per step of a
//! launch on its stream's track (`gpu step`: each copy, flag kernel and
//! reduction), each timed by a pair of events around it and placed on the
//! host clock through one anchor event whose completion the host saw; and
//! the host hand-off's waits for its GPU.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use super::error::CudaError;
use super::gpu::Gpu;
use crate::trace::{monotonic_ns, Arg, Recorder, Track};

/// A span of GPU work, waiting for its events to be read.
struct Pending {
    /// The named track of the stream it ran on; none for a call's kernels,
    /// which stay on the host's track beside the call.
    track: Option<&'static str>,
    name: &'static str,
    category: &'static str,
    start: CudaEvent,
    end: CudaEvent,
    args: Vec<(&'static str, Arg)>,
}

/// The kernel and GPU step spans of one communicator's calls.
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

    /// Records the start of a call's launches, or of a step, on `stream`
    /// (and, the first time, the anchor: recorded, waited for, and stamped
    /// on the host).
    pub(super) fn begin(&mut self, stream: &CudaStream) -> Result<CudaEvent, CudaError> {
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
        stream: &CudaStream,
        name: &'static str,
        args: Vec<(&'static str, Arg)>,
    ) -> Result<(), CudaError> {
        self.push(None, "kernel", name, start, stream, args)
    }

    /// Records the end of the step `start` began on `stream`, drawn on the
    /// track named `track`.
    pub(super) fn end_step(
        &mut self,
        start: CudaEvent,
        stream: &CudaStream,
        track: &'static str,
        name: &'static str,
        args: Vec<(&'static str, Arg)>,
    ) -> Result<(), CudaError> {
        self.push(Some(track), "gpu step", name, start, stream, args)
    }

    fn push(
        &mut self,
        track: Option<&'static str>,
        category: &'static str,
        name: &'static str,
        start: CudaEvent,
        stream: &CudaStream,
        args: Vec<(&'static str, Arg)>,
    ) -> Result<(), CudaError> {
        let end = self.gpu.new_timing_event()?;
        end.record(stream)
            .map_err(self.gpu.driver("recording a kernel span's end"))?;
        self.pending.push(Pending {
            track,
            name,
            category,
            start,
            end,
            args,
        });
        Ok(())
    }

    /// Waits for the GPU and turns every pending span into one of
    /// `recorder`. Events that never ran (captured into a graph rather than
    /// launched) have no time and are left out.
    pub(super) fn resolve(&mut self, recorder: &Recorder) {
        let Some((anchor, anchor_ns)) = &self.anchor else {
            return;
        };
        let _ = self.gpu.synchronize();
        for span in self.pending.drain(..) {
            let (Ok(from_anchor), Ok(duration)) = (
                anchor.elapsed_ms(&span.start),
                span.start.elapsed_ms(&span.end),
            ) else {
                continue;
            };
            let start_ns = anchor_ns + (f64::from(from_anchor) * 1e6) as u64;
            let track = span.track.map_or(Track::HOST, |name| recorder.track(name));
            recorder.span_on(
                track,
                span.name,
                span.category,
                start_ns,
                start_ns + (f64::from(duration) * 1e6) as u64,
                span.args,
            );
        }
    }
}
