//! Small messages on GPUs: the rounds of `schedule::OneShot`, each reduced
//! by one kernel over every rank's buffer.

use super::device_call::DeviceCall;
use super::meeting::Meeting;
use crate::engine::cuda::error::on_rank;
use crate::engine::cuda::staging::Staging;
use crate::engine::schedule::OneShot;
use crate::engine::EngineError;

/// Every rank copies its input to a one-shot buffer, the ranks meet, and
/// each reduces all N buffers in rank order in one kernel. The two buffers
/// alternate (`parity`, the communicator's, flipped every round), so a
/// round's buffer is rewritten only after the next round's meeting, by
/// which time every reader's GPU has finished with it.
pub(super) fn run(
    meeting: &mut Meeting,
    staging: &Staging,
    parity: &mut usize,
    call: &DeviceCall,
) -> Result<(), EngineError> {
    let gpu = meeting.gpu;
    let (rank, nranks) = (meeting.control.rank(), meeting.control.nranks());
    let element = call.element;
    let schedule = OneShot {
        count: call.count,
        window_elements: (staging.layout.one_shot_bytes() / element).max(1),
    };
    for round in 0..schedule.rounds() {
        let range = schedule.round(round);
        let offset = staging.layout.one_shot(*parity);
        *parity ^= 1;
        let queued = gpu.copy(
            staging.own(offset),
            call.at(call.input, range.start),
            range.len() * element,
        );
        meeting.barrier(queued)?;
        let sources: Vec<u64> = (0..nranks)
            .map(|owner| {
                if owner == rank {
                    staging.own(offset)
                } else {
                    staging.peer(owner, offset)
                }
            })
            .collect();
        call.kernel
            .one_shot(
                gpu.stream(),
                call.at(call.output, range.start),
                &sources,
                range.len(),
                call.divide_by,
            )
            .and_then(|()| meeting.finish_gpu())
            .map_err(on_rank(rank))?;
    }
    Ok(())
}
