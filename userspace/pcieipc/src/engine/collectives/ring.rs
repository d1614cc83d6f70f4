//! The ring on the host: reduce-scatter and/or all-gather as
//! `schedule::Ring` lays them out, pipelined with `in_flight` chunks of
//! slack per step. Where ranks may read each other's memory, a finished
//! chunk is forwarded as its address in the sender's output, which the
//! successor reads from there (one copy instead of two); partial sums
//! always travel in the relay slots. Where the ranks' data outgrows the
//! cache, the first step fills its slots past it (`cache_bypass`).

use std::ops::RangeInclusive;

use super::buffers::{Buffers, RingCall};
use super::step_trace::{step_start, trace_step};
use crate::engine::cache_bypass::copy_bypassing_cache;
use crate::engine::call::CallDescriptor;
use crate::engine::comm::message::Stream;
use crate::engine::comm::peers::Peers;
use crate::engine::comm::streams::SlotStreams;
use crate::engine::dtype::{combine, finish_avg, Element, ReduceOp};
use crate::engine::error::EngineError;
use crate::engine::schedule::{clip, Ring, RingKind, StepRole};
use crate::engine::slot_fill::SlotFill;
use crate::engine::transport::Signal;

/// What the ranks agreed at init that the ring's steps depend on.
pub(crate) struct RingSettings {
    /// The message sizes whose all-gather reads finished chunks straight
    /// from the predecessor's output; `None` where ranks may not read each
    /// other's memory.
    pub(crate) single_copy_messages: Option<RangeInclusive<usize>>,
    /// The working set in bytes from which the raw slots are filled with
    /// non-temporal stores (`usize::MAX`: never).
    pub(crate) streaming_from: usize,
}

/// Runs one ring call; returns how it filled its slots (for its trace and
/// the fill measurements).
pub(crate) fn run<T: Element>(
    peers: &mut Peers,
    streams: &mut SlotStreams,
    settings: &RingSettings,
    call: CallDescriptor,
    ring_call: RingCall,
    mut buffers: Buffers<T>,
) -> Result<SlotFill, EngineError> {
    let (kind, op) = match ring_call {
        RingCall::AllReduce(op) => (RingKind::AllReduce, Some(op)),
        RingCall::ReduceScatter(op) => (RingKind::ReduceScatter, Some(op)),
        RingCall::AllGather => (RingKind::AllGather, None),
    };
    let per_rank = match kind {
        RingKind::AllReduce | RingKind::AllGather => buffers.input().len(),
        RingKind::ReduceScatter => buffers.output().len(),
    };
    let (n, r) = (peers.nranks, peers.rank);
    if n == 1 {
        if let Buffers::OutOfPlace { input, output } = &mut buffers {
            output.copy_from_slice(input);
        }
        return Ok(SlotFill::Cached);
    }
    let ring = Ring {
        kind,
        nranks: n,
        per_rank,
    };
    if let (RingKind::AllGather, Buffers::OutOfPlace { input, output }) = (kind, &mut buffers) {
        output[ring.segment(r)].copy_from_slice(input);
    }
    let chunk_elements = (call.chunk_bytes as usize / std::mem::size_of::<T>()).max(1);
    let chunks = ring.chunks(chunk_elements);
    // Each step runs as many chunks ahead as the call's raw slots allow.
    let largest_message = chunk_elements.min(ring.longest_segment()) * std::mem::size_of::<T>();
    let lag = streams.use_slots_for_ring(peers, largest_message)? - 1;
    let message_bytes = ring.message_elements() * std::mem::size_of::<T>();
    let single_copy = settings
        .single_copy_messages
        .as_ref()
        .is_some_and(|messages| messages.contains(&message_bytes));
    let predecessor = peers.predecessor();
    let size = std::mem::size_of::<T>();
    let mut addresses_sent = false;
    let fill = if buffers.bytes_touched().saturating_mul(n) >= settings.streaming_from {
        SlotFill::RawBypass
    } else if call.bypass_slots {
        SlotFill::Bypass
    } else {
        SlotFill::Cached
    };
    for iteration in 0..ring.iterations(chunks, lag) {
        if iteration < chunks {
            let traced_from = step_start(peers);
            let range = clip(
                &ring.input_range(ring.sent_segment(r, 0)),
                iteration,
                chunk_elements,
            );
            let bytes = range.len() * std::mem::size_of::<T>();
            let mut slot = streams.send_slot::<T>(peers, Stream::Raw, range.len())?;
            if fill.raw_bypasses() {
                copy_bypassing_cache(&mut slot, &buffers.input()[range]);
            } else {
                slot.copy_from_slice(&buffers.input()[range]);
            }
            streams.post(peers, Stream::Raw, slot);
            trace_step(peers, "send", traced_from, 0, iteration, bytes);
        }
        for k in 0..ring.steps() {
            let Some(chunk) = ring.received_chunk(iteration, k, lag, chunks) else {
                continue;
            };
            let traced_from = step_start(peers);
            let stream = if k == 0 { Stream::Raw } else { Stream::Relay };
            let s = ring.received_segment(r, k);
            let len = ring.chunk(s, chunk, chunk_elements).len();
            let in_range = clip(&ring.input_range(s), chunk, chunk_elements);
            let out_range = clip(&ring.output_range(s), chunk, chunk_elements);
            let forward = ring.forwards(k);
            let role = ring.role(k);
            let finished_out = single_copy && forward && role != StepRole::Accumulate;
            let finished_in = single_copy && k >= 1 && role == StepRole::Gather;
            if finished_in {
                let message = streams.receive::<i64>(peers, stream, 1)?;
                let address = message[0] as u64;
                peers.read_peer(
                    predecessor,
                    address,
                    &mut buffers.output()[out_range.clone()],
                )?;
                if forward {
                    streams.send_address(peers, &buffers.output()[out_range])?;
                    addresses_sent = true;
                }
                streams.release(peers, stream, message);
                trace_step(peers, "read", traced_from, k, chunk, len * size);
                continue;
            }
            let incoming = streams.receive::<T>(peers, stream, len)?;
            match role {
                StepRole::Accumulate => {
                    let op = op.expect("reduce steps have an op");
                    let mut slot = streams.send_slot::<T>(peers, Stream::Relay, len)?;
                    combine(op, &mut slot, &incoming, Some(&buffers.input()[in_range]));
                    streams.post(peers, Stream::Relay, slot);
                }
                StepRole::Finish => {
                    let op = op.expect("reduce steps have an op");
                    match &mut buffers {
                        Buffers::InPlace(buffer) => {
                            combine(op, &mut buffer[out_range.clone()], &incoming, None)
                        }
                        Buffers::OutOfPlace { input, output } => combine(
                            op,
                            &mut output[out_range.clone()],
                            &incoming,
                            Some(&input[in_range]),
                        ),
                    }
                    if op == ReduceOp::Avg {
                        finish_avg(&mut buffers.output()[out_range.clone()], n);
                    }
                }
                StepRole::Gather => {
                    buffers.output()[out_range.clone()].copy_from_slice(&incoming);
                }
            }
            if role != StepRole::Accumulate {
                if finished_out {
                    streams.send_address(peers, &buffers.output()[out_range])?;
                    addresses_sent = true;
                } else if forward {
                    let mut slot = streams.send_slot::<T>(peers, Stream::Relay, len)?;
                    if fill.relay_bypasses() {
                        copy_bypassing_cache(&mut slot, &buffers.output()[out_range]);
                    } else {
                        slot.copy_from_slice(&buffers.output()[out_range]);
                    }
                    streams.post(peers, Stream::Relay, slot);
                }
            }
            streams.release(peers, stream, incoming);
            let name = match role {
                StepRole::Accumulate | StepRole::Finish => "reduce",
                StepRole::Gather => "copy",
            };
            trace_step(peers, name, traced_from, k, chunk, len * size);
        }
    }
    if addresses_sent {
        // The successor reads from our output until it acknowledges the
        // last address we sent: only then may the caller have it back.
        let sent = streams.sent(Stream::Relay);
        peers.wait_for(peers.successor(), peers.rank, Signal::RelayConsumed, sent)?;
    }
    if single_copy {
        // A predecessor that failed (and returned) before we read from
        // it recorded the failure first: what we read may be stale.
        if let Some(failure) = peers.transport.failure() {
            return Err(failure.into());
        }
    }
    Ok(fill)
}
