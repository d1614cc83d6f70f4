//! One-shot all_reduce on the host: every rank publishes its buffer in its
//! one-shot windows, round by round, and reduces all N in rank order.

use super::Buffers;
use crate::engine::call::CallDescriptor;
use crate::engine::comm::{Communicator, MESSAGE_HEADER_BYTES};
use crate::engine::dtype::{combine, finish_avg, Element, ReduceOp};
use crate::engine::error::EngineError;
use crate::engine::schedule::OneShot;
use crate::trace::monotonic_ns;

impl Communicator {
    pub(crate) fn run_one_shot<T: Element>(
        &mut self,
        call: CallDescriptor,
        op: ReduceOp,
        mut buffers: Buffers<T>,
    ) -> Result<(), EngineError> {
        let schedule = OneShot {
            count: call.count as usize,
            window_elements: (self.transport.sizes().one_shot_bytes - MESSAGE_HEADER_BYTES)
                / std::mem::size_of::<T>(),
        };
        for round in 0..schedule.rounds() {
            let range = schedule.round(round);
            let bytes = range.len() * std::mem::size_of::<T>();
            let traced_from = self.trace.as_ref().map(|_| monotonic_ns());
            let parity = OneShot::window_parity(u64::from(self.one_shot_rounds));
            self.post_one_shot(parity, &buffers.input()[range.clone()]);
            self.trace_step("send", traced_from, round, 0, bytes);
            let traced_from = self.trace.as_ref().map(|_| monotonic_ns());
            for owner in 0..self.nranks {
                if owner != self.rank {
                    self.wait_for_one_shot(owner, parity, self.one_shot_rounds)?;
                }
                // A peer's stamp is checked once per call; our own needs no check.
                let check_stamp = round == 0 && owner != self.rank;
                self.take_one_shot_window::<T>(owner, parity, range.len(), check_stamp)?;
            }
            // Each owner posted this round; nobody writes its window again
            // until every rank has posted the next round.
            let data = |owner: usize| self.one_shot_data::<T>(owner, parity, range.len());
            let output = &mut buffers.output()[range.clone()];
            combine(op, output, &data(1), Some(&data(0)));
            for owner in 2..self.nranks {
                combine(op, output, &data(owner), None);
            }
            if op == ReduceOp::Avg {
                finish_avg(output, self.nranks);
            }
            self.trace_step("reduce", traced_from, round, 0, bytes * (self.nranks - 1));
        }
        Ok(())
    }
}
