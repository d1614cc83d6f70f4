//! Broadcast on the host: the chain `schedule::Chain` lays out, pipelined on
//! the raw stream; the root's chunk size reaches the others on the stamp of
//! its first message.

use crate::engine::call::CallDescriptor;
use crate::engine::comm::message::Stream;
use crate::engine::comm::peers::Peers;
use crate::engine::comm::streams::SlotStreams;
use crate::engine::dtype::Element;
use crate::engine::error::EngineError;
use crate::engine::schedule::{clip, Chain};

pub(crate) fn run<T: Element>(
    peers: &mut Peers,
    streams: &mut SlotStreams,
    call: CallDescriptor,
    buffer: &mut [T],
    root: usize,
) -> Result<(), EngineError> {
    let chain = Chain {
        nranks: peers.nranks,
        root,
    };
    let is_root = chain.position(peers.rank) == 0;
    streams.use_raw_slots_for_broadcast(peers)?;
    let chunk_bytes = if is_root {
        call.chunk_bytes
    } else {
        streams.adopt_stamped_chunk(peers, Stream::Raw)?
    };
    let chunk_elements = (chunk_bytes as usize / std::mem::size_of::<T>()).max(1);
    let chunks = buffer.len().div_ceil(chunk_elements).max(1);
    for chunk in 0..chunks {
        let range = clip(&(0..buffer.len()), chunk, chunk_elements);
        if is_root {
            let mut slot = streams.send_slot::<T>(peers, Stream::Raw, range.len())?;
            slot.copy_from_slice(&buffer[range]);
            streams.post(peers, Stream::Raw, slot);
            continue;
        }
        let incoming = streams.receive::<T>(peers, Stream::Raw, range.len())?;
        buffer[range.clone()].copy_from_slice(&incoming);
        if chain.forwards(peers.rank) {
            let mut slot = streams.send_slot::<T>(peers, Stream::Raw, range.len())?;
            slot.copy_from_slice(&incoming);
            streams.post(peers, Stream::Raw, slot);
        }
        streams.release(peers, Stream::Raw, incoming);
    }
    Ok(())
}
