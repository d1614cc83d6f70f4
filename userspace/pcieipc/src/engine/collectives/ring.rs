//! The ring on the host: reduce-scatter and/or all-gather as
//! `schedule::Ring` lays them out, pipelined with `in_flight` chunks of
//! slack per step. Where ranks may read each other's memory, a finished
//! chunk is forwarded as its address in the sender's output, which the
//! successor reads from there (one copy instead of two); partial sums
//! always travel in the relay slots. Where the ranks' data outgrows the
//! cache, the first step fills its slots past it (`cache_bypass`).

use super::{Buffers, RingCall};
use crate::engine::cache_bypass::copy_bypassing_cache;
use crate::engine::call::CallDescriptor;
use crate::engine::comm::{Communicator, Stream};
use crate::engine::dtype::{combine, finish_avg, Element, ReduceOp};
use crate::engine::error::EngineError;
use crate::engine::schedule::{clip, Ring, RingKind, StepRole};
use crate::engine::slot_fill::SlotFill;
use crate::engine::transport::Signal;
use crate::trace::monotonic_ns;

impl Communicator {
    pub(crate) fn run_ring<T: Element>(
        &mut self,
        call: CallDescriptor,
        ring_call: RingCall,
        mut buffers: Buffers<T>,
    ) -> Result<(), EngineError> {
        let (kind, op) = match ring_call {
            RingCall::AllReduce(op) => (RingKind::AllReduce, Some(op)),
            RingCall::ReduceScatter(op) => (RingKind::ReduceScatter, Some(op)),
            RingCall::AllGather => (RingKind::AllGather, None),
        };
        let per_rank = match kind {
            RingKind::AllReduce | RingKind::AllGather => buffers.input().len(),
            RingKind::ReduceScatter => buffers.output().len(),
        };
        let (n, r) = (self.nranks, self.rank);
        if n == 1 {
            if let Buffers::OutOfPlace { input, output } = &mut buffers {
                output.copy_from_slice(input);
            }
            return Ok(());
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
        let lag = self.use_raw_slots_for_ring(call.chunk_bytes)? - 1;
        let message_bytes = ring.message_elements() * std::mem::size_of::<T>();
        let single_copy =
            self.single_copy && self.options.single_copy_messages.contains(&message_bytes);
        let predecessor = self.predecessor();
        let size = std::mem::size_of::<T>();
        let mut addresses_sent = false;
        let fill = if buffers.bytes_touched().saturating_mul(n) >= self.streaming_from {
            SlotFill::RawBypass
        } else if call.bypass_slots {
            SlotFill::Bypass
        } else {
            SlotFill::Cached
        };
        self.current_fill = Some(fill);
        for iteration in 0..ring.iterations(chunks, lag) {
            if iteration < chunks {
                let traced_from = self.trace.as_ref().map(|_| monotonic_ns());
                let range = clip(
                    &ring.input_range(ring.sent_segment(r, 0)),
                    iteration,
                    chunk_elements,
                );
                let bytes = range.len() * std::mem::size_of::<T>();
                let mut slot = self.send_slot::<T>(Stream::Raw, range.len())?;
                if fill.raw_bypasses() {
                    copy_bypassing_cache(&mut slot, &buffers.input()[range]);
                } else {
                    slot.copy_from_slice(&buffers.input()[range]);
                }
                self.post(Stream::Raw, slot);
                self.trace_step("send", traced_from, 0, iteration, bytes);
            }
            for k in 0..ring.steps() {
                let Some(chunk) = ring.received_chunk(iteration, k, lag, chunks) else {
                    continue;
                };
                let traced_from = self.trace.as_ref().map(|_| monotonic_ns());
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
                    let message = self.receive::<i64>(stream, 1)?;
                    let address = message[0] as u64;
                    self.read_peer(
                        predecessor,
                        address,
                        &mut buffers.output()[out_range.clone()],
                    )?;
                    if forward {
                        self.send_address(&buffers.output()[out_range])?;
                        addresses_sent = true;
                    }
                    self.release(stream, message);
                    self.trace_step("read", traced_from, k, chunk, len * size);
                    continue;
                }
                let incoming = self.receive::<T>(stream, len)?;
                match role {
                    StepRole::Accumulate => {
                        let op = op.expect("reduce steps have an op");
                        let mut slot = self.send_slot::<T>(Stream::Relay, len)?;
                        combine(op, &mut slot, &incoming, Some(&buffers.input()[in_range]));
                        self.post(Stream::Relay, slot);
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
                        self.send_address(&buffers.output()[out_range])?;
                        addresses_sent = true;
                    } else if forward {
                        let mut slot = self.send_slot::<T>(Stream::Relay, len)?;
                        if fill.relay_bypasses() {
                            copy_bypassing_cache(&mut slot, &buffers.output()[out_range]);
                        } else {
                            slot.copy_from_slice(&buffers.output()[out_range]);
                        }
                        self.post(Stream::Relay, slot);
                    }
                }
                self.release(stream, incoming);
                let name = match role {
                    StepRole::Accumulate | StepRole::Finish => "reduce",
                    StepRole::Gather => "copy",
                };
                self.trace_step(name, traced_from, k, chunk, len * size);
            }
        }
        if addresses_sent {
            // The successor reads from our output until it acknowledges the
            // last address we sent: only then may the caller have it back.
            let sent = self.relay.sent;
            self.wait_for(self.successor(), self.rank, Signal::RelayConsumed, sent)?;
        }
        if single_copy {
            // A predecessor that failed (and returned) before we read from
            // it recorded the failure first: what we read may be stale.
            if let Some(failure) = self.transport.failure() {
                return Err(failure.into());
            }
        }
        Ok(())
    }
}
