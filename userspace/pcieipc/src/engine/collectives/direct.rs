//! Direct all_reduce on the host, as `schedule::Direct` lays it out: each
//! rank reduces its own segment reading every peer's input, then reads the
//! other segments from their owners' outputs. Ranks only ever read each
//! other's memory: a rank that fails mid-call cannot leave a peer writing
//! into buffers it has already handed back.
//!
//! Three rounds on the one-shot counter: the buffers' addresses (in the
//! one-shot window, stamped with the call); the segment reduced (its owner
//! is done reading the peers' inputs, so in place each peer may now
//! overwrite its own copy of that segment); done. A rank returns once every
//! peer is done, since until then peers may still read its buffers.
//!
//! The all-gather reads whole segments after the reduce-scatter rather than
//! piece by piece behind it: a piece just reduced sits modified in its
//! owner's cache, and copying it from there to another core measured a
//! third slower than from the shared cache once the segment is done.

use super::buffers::Buffers;
use crate::engine::call::CallDescriptor;
use crate::engine::comm::peers::Peers;
use crate::engine::comm::streams::SlotStreams;
use crate::engine::dtype::{combine, elements_of_words, finish_avg, Element, ReduceOp};
use crate::engine::error::EngineError;
use crate::engine::schedule::{Direct, OneShot};

/// The piece the direct algorithm reads from one peer and reduces before the
/// next: small enough to stay in the core's cache between the two.
const DIRECT_PIECE_BYTES: usize = 256 << 10;

/// Runs one direct all_reduce; `scratch` is where the pieces read from
/// peers land, kept between calls.
pub(crate) fn run<T: Element>(
    peers: &mut Peers,
    streams: &mut SlotStreams,
    scratch: &mut Vec<u64>,
    call: CallDescriptor,
    op: ReduceOp,
    mut buffers: Buffers<T>,
) -> Result<(), EngineError> {
    let (n, r) = (peers.nranks, peers.rank);
    let schedule = Direct {
        count: call.count as usize,
        nranks: n,
    };
    let parity = OneShot::window_parity(u64::from(streams.one_shot_rounds()));
    let [input_at, output_at] = [0, 1];
    let mut mine = [0u64; 2];
    mine[input_at] = buffers.input().as_ptr() as u64;
    mine[output_at] = buffers.output().as_mut_ptr() as u64;
    streams.post_one_shot(peers, parity, &mine);
    let mut peer_buffers = vec![[0u64; 2]; n];
    for peer in schedule.peers(r) {
        streams.wait_for_one_shot(peers, peer, parity)?;
        streams.take_one_shot_window::<u64>(peers, peer, parity, 2, true)?;
        peer_buffers[peer].copy_from_slice(&streams.one_shot_data::<u64>(peers, peer, parity, 2));
    }
    let element = std::mem::size_of::<T>();

    scratch.resize(DIRECT_PIECE_BYTES / 8, 0);
    let incoming = elements_of_words::<T>(scratch);
    for range in schedule.pieces(r, incoming.len()) {
        let offset = (range.start * element) as u64;
        let incoming = &mut incoming[..range.len()];
        for (position, peer) in schedule.peers(r).enumerate() {
            peers.read_peer(peer, peer_buffers[peer][input_at] + offset, incoming)?;
            match (&mut buffers, position) {
                (Buffers::OutOfPlace { input, output }, 0) => combine(
                    op,
                    &mut output[range.clone()],
                    incoming,
                    Some(&input[range.clone()]),
                ),
                _ => combine(op, &mut buffers.output()[range.clone()], incoming, None),
            }
        }
        if op == ReduceOp::Avg {
            finish_avg(&mut buffers.output()[range], n);
        }
    }

    streams.post_round(peers);
    for peer in schedule.peers(r) {
        streams.wait_for_round(peers, peer)?;
        let range = schedule.owned(peer);
        let offset = (range.start * element) as u64;
        peers.read_peer(
            peer,
            peer_buffers[peer][output_at] + offset,
            &mut buffers.output()[range],
        )?;
    }
    streams.post_round(peers);
    for peer in schedule.peers(r) {
        streams.wait_for_round(peers, peer)?;
    }
    // A peer that failed (and returned) before we read its segment
    // recorded the failure first: what we read may be stale.
    if let Some(failure) = peers.transport.failure() {
        return Err(failure.into());
    }
    Ok(())
}
