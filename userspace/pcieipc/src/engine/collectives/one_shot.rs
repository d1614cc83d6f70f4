//! One-shot all_reduce on the host: every rank publishes its buffer in its
//! one-shot windows, round by round, and reduces all N in rank order.

use super::buffers::Buffers;
use super::step_trace::{step_start, trace_step};
use crate::engine::call::CallDescriptor;
use crate::engine::comm::peers::Peers;
use crate::engine::comm::streams::SlotStreams;
use crate::engine::dtype::{combine, finish_avg, Element, ReduceOp};
use crate::engine::error::EngineError;
use crate::engine::schedule::OneShot;

pub(crate) fn run<T: Element>(
    peers: &mut Peers,
    streams: &mut SlotStreams,
    call: CallDescriptor,
    op: ReduceOp,
    mut buffers: Buffers<T>,
) -> Result<(), EngineError> {
    let schedule = OneShot {
        count: call.count as usize,
        window_elements: SlotStreams::one_shot_capacity(peers) / std::mem::size_of::<T>(),
    };
    for round in 0..schedule.rounds() {
        let range = schedule.round(round);
        let bytes = range.len() * std::mem::size_of::<T>();
        let traced_from = step_start(peers);
        let parity = OneShot::window_parity(u64::from(streams.one_shot_rounds()));
        streams.post_one_shot(peers, parity, &buffers.input()[range.clone()]);
        trace_step(peers, "send", traced_from, round, 0, bytes);
        let traced_from = step_start(peers);
        for owner in 0..peers.nranks {
            if owner != peers.rank {
                streams.wait_for_one_shot(peers, owner, parity)?;
            }
            // A peer's stamp is checked once per call; our own needs no check.
            let check_stamp = round == 0 && owner != peers.rank;
            streams.take_one_shot_window::<T>(peers, owner, parity, range.len(), check_stamp)?;
        }
        // Each owner posted this round; nobody writes its window again
        // until every rank has posted the next round.
        let data = |owner: usize| streams.one_shot_data::<T>(peers, owner, parity, range.len());
        let output = &mut buffers.output()[range.clone()];
        combine(op, output, &data(1), Some(&data(0)));
        for owner in 2..peers.nranks {
            combine(op, output, &data(owner), None);
        }
        if op == ReduceOp::Avg {
            finish_avg(output, peers.nranks);
        }
        trace_step(
            peers,
            "reduce",
            traced_from,
            round,
            0,
            bytes * (peers.nranks - 1),
        );
    }
    Ok(())
}
