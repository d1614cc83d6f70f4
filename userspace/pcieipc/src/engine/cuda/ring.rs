//! The ring on GPUs: the steps of `schedule::Ring` (all_reduce), one
//! iteration of the pipeline per host meeting.

use super::collective::DeviceCall;
use super::communicator::CudaCommunicator;
use super::gpu::CudaError;
use crate::engine::schedule::{Ring, RingKind, StepRole};
use crate::engine::EngineError;

impl CudaCommunicator {
    /// The ring: reduce-scatter then all-gather, 2(N−1) steps, pipelined with
    /// one chunk of slack, so that in iteration i every step k works on chunk
    /// i − k − 1 (received from the predecessor, which produced it in
    /// iteration i − 1). One host barrier per iteration.
    pub(super) fn run_ring(&mut self, call: &DeviceCall) -> Result<(), EngineError> {
        let r = self.rank;
        let ring = Ring {
            kind: RingKind::AllReduce,
            nranks: self.nranks,
            per_rank: call.count,
        };
        let predecessor = ring.predecessor(r);
        let element = call.dtype.size_bytes();
        let steps = ring.steps();
        let chunk_elements = (self.layout.slot_bytes / element).max(1);
        let chunks = ring.chunks(chunk_elements);
        let at = |base: u64, element_index: usize| base + (element_index * element) as u64;
        for iteration in 0..ring.iterations(chunks, 1) {
            let queued = (|| -> Result<(), CudaError> {
                if iteration < chunks && !call.registered_input {
                    let range = ring.chunk(ring.sent_segment(r, 0), iteration, chunk_elements);
                    self.gpu.copy(
                        self.own(self.layout.slot(0, iteration % 2)),
                        at(call.input, range.start),
                        range.len() * element,
                    )?;
                }
                for k in 0..steps {
                    let Some(chunk) = ring.received_chunk(iteration, k, 1, chunks) else {
                        continue;
                    };
                    let range = ring.chunk(ring.received_segment(r, k), chunk, chunk_elements);
                    if range.is_empty() {
                        continue;
                    }
                    let remote = if k == 0 && call.registered_input {
                        let registration = &self.registered[&call.input];
                        let mapping = registration.peers[predecessor]
                            .as_ref()
                            .expect("registered buffers are open on the peer-to-peer path");
                        at(mapping.address(), range.start)
                    } else {
                        self.peer(predecessor, self.layout.slot(k, (chunk + k) % 2))
                    };
                    // One landing buffer serves every step: the stream runs
                    // each copy and the kernel that reads it before the next.
                    let incoming = match &self.landing {
                        Some(landing) if ring.role(k) != StepRole::Gather => {
                            self.gpu
                                .copy(landing.address(), remote, range.len() * element)?;
                            landing.address()
                        }
                        _ => remote,
                    };
                    let forward = ring
                        .forwards(k)
                        .then(|| self.own(self.layout.slot(k + 1, iteration % 2)));
                    let (own, out) = (at(call.input, range.start), at(call.output, range.start));
                    let len = range.len();
                    match ring.role(k) {
                        StepRole::Accumulate => {
                            let forward = forward.expect("a reduce step before the last forwards");
                            call.kernel.reduce(
                                &self.gpu, call.dtype, forward, None, incoming, own, len, 0,
                            )?;
                        }
                        StepRole::Finish => call.kernel.reduce(
                            &self.gpu,
                            call.dtype,
                            out,
                            forward,
                            incoming,
                            own,
                            len,
                            call.divide_by,
                        )?,
                        StepRole::Gather => {
                            self.gpu.copy(out, incoming, len * element)?;
                            if let Some(forward) = forward {
                                self.gpu.copy(forward, incoming, len * element)?;
                            }
                        }
                    }
                }
                Ok(())
            })();
            self.barrier(queued)?;
        }
        Ok(())
    }
}
