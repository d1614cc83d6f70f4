//! Small messages on GPUs: the rounds of `schedule::OneShot`, each reduced
//! by one kernel over every rank's buffer.

use super::collective::DeviceCall;
use super::communicator::{on_rank, CudaCommunicator};
use crate::engine::schedule::OneShot;
use crate::engine::EngineError;

impl CudaCommunicator {
    /// Small messages: every rank copies its input to a one-shot buffer, the
    /// ranks meet, and each reduces all N buffers in rank order in one
    /// kernel. The two buffers alternate, so a round's buffer is rewritten
    /// only after the next round's meeting, by which time every reader's GPU
    /// has finished with it.
    pub(super) fn run_one_shot(&mut self, call: &DeviceCall) -> Result<(), EngineError> {
        let element = call.dtype.size_bytes();
        let schedule = OneShot {
            count: call.count,
            window_elements: (self.layout.one_shot_bytes / element).max(1),
        };
        for round in 0..schedule.rounds() {
            let range = schedule.round(round);
            let parity = self.one_shot_parity;
            self.one_shot_parity ^= 1;
            let offset = self.layout.one_shot(parity);
            let start = (range.start * element) as u64;
            let queued = self
                .gpu
                .copy(self.own(offset), call.input + start, range.len() * element);
            self.barrier(queued)?;
            let sources: Vec<u64> = (0..self.nranks)
                .map(|owner| {
                    if owner == self.rank {
                        self.own(offset)
                    } else {
                        self.peer(owner, offset)
                    }
                })
                .collect();
            call.kernel
                .one_shot(
                    &self.gpu,
                    call.dtype,
                    call.output + start,
                    &sources,
                    range.len(),
                    call.divide_by,
                )
                .and_then(|()| self.finish_gpu())
                .map_err(on_rank(self.rank))?;
        }
        Ok(())
    }
}
