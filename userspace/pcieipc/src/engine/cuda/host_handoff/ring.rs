//! The ring on GPUs: the steps of `schedule::Ring` (all_reduce), one
//! iteration of the pipeline per host meeting.

use super::device_call::DeviceCall;
use super::meeting::Meeting;
use crate::engine::cuda::error::CudaError;
use crate::engine::cuda::memory::DeviceBuffer;
use crate::engine::cuda::registration::Registrations;
use crate::engine::cuda::staging::Staging;
use crate::engine::schedule::{Ring, RingKind, StepRole};
use crate::engine::EngineError;

/// The ring: reduce-scatter then all-gather, 2(N−1) steps, pipelined with
/// one chunk of slack, so that in iteration i every step k works on chunk
/// i − k − 1 (received from the predecessor, which produced it in
/// iteration i − 1). One host meeting per iteration. `landing`: where the
/// copy engine brings the predecessor's chunk before a reduce step reads it
/// (`PeerRead::CopyEngine`); without it the kernel reads the peer's memory.
/// A registered input is read from the predecessor's counterpart in
/// `registrations` at the first step.
pub(super) fn run(
    meeting: &mut Meeting,
    staging: &Staging,
    landing: Option<&DeviceBuffer<u8>>,
    registrations: &Registrations,
    call: &DeviceCall,
) -> Result<(), EngineError> {
    let gpu = meeting.gpu;
    let (r, nranks) = (meeting.control.rank(), meeting.control.nranks());
    let layout = staging.layout;
    let ring = Ring {
        kind: RingKind::AllReduce,
        nranks,
        per_rank: call.count,
    };
    let predecessor = ring.predecessor(r);
    let predecessor_input = call.registered_input.then(|| {
        registrations
            .peer_address(call.input, predecessor)
            .expect("registered buffers are open on the peer-to-peer path")
    });
    let element = call.element;
    let steps = ring.steps();
    let chunk_elements = (layout.slot_bytes() / element).max(1);
    let chunks = ring.chunks(chunk_elements);
    for iteration in 0..ring.iterations(chunks, 1) {
        let queued = (|| -> Result<(), CudaError> {
            if iteration < chunks && predecessor_input.is_none() {
                let range = ring.chunk(ring.sent_segment(r, 0), iteration, chunk_elements);
                gpu.copy(
                    staging.own(layout.slot(0, iteration % 2)),
                    call.at(call.input, range.start),
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
                let remote = match predecessor_input {
                    Some(predecessor_input) if k == 0 => call.at(predecessor_input, range.start),
                    _ => staging.peer(predecessor, layout.slot(k, (chunk + k) % 2)),
                };
                // One landing buffer serves every step: the stream runs
                // each copy and the kernel that reads it before the next.
                let incoming = match landing {
                    Some(landing) if ring.role(k) != StepRole::Gather => {
                        gpu.copy(landing.address(), remote, range.len() * element)?;
                        landing.address()
                    }
                    _ => remote,
                };
                let forward = ring
                    .forwards(k)
                    .then(|| staging.own(layout.slot(k + 1, iteration % 2)));
                let (own, out) = (
                    call.at(call.input, range.start),
                    call.at(call.output, range.start),
                );
                let len = range.len();
                let stream = gpu.stream();
                match ring.role(k) {
                    StepRole::Accumulate => {
                        let forward = forward.expect("a reduce step before the last forwards");
                        call.kernel
                            .reduce(stream, forward, None, incoming, own, len, 0)?;
                    }
                    StepRole::Finish => call.kernel.reduce(
                        stream,
                        out,
                        forward,
                        incoming,
                        own,
                        len,
                        call.divide_by,
                    )?,
                    StepRole::Gather => {
                        gpu.copy(out, incoming, len * element)?;
                        if let Some(forward) = forward {
                            gpu.copy(forward, incoming, len * element)?;
                        }
                    }
                }
            }
            Ok(())
        })();
        meeting.barrier(queued)?;
    }
    Ok(())
}
