//! Broadcast on the host: the chain `schedule::Chain` lays out, pipelined on
//! the raw stream; the root's chunk size reaches the others on the stamp of
//! its first message.

use crate::engine::call::CallDescriptor;
use crate::engine::comm::{Communicator, Stream};
use crate::engine::dtype::Element;
use crate::engine::error::EngineError;
use crate::engine::schedule::{clip, Chain};

impl Communicator {
    pub(crate) fn run_broadcast<T: Element>(
        &mut self,
        call: CallDescriptor,
        buffer: &mut [T],
        root: usize,
    ) -> Result<(), EngineError> {
        let chain = Chain {
            nranks: self.nranks,
            root,
        };
        let is_root = chain.position(self.rank) == 0;
        self.use_raw_slots_for_broadcast()?;
        let chunk_bytes = if is_root {
            call.chunk_bytes
        } else {
            self.adopt_stamped_chunk(Stream::Raw)?
        };
        let chunk_elements = (chunk_bytes as usize / std::mem::size_of::<T>()).max(1);
        let chunks = buffer.len().div_ceil(chunk_elements).max(1);
        for chunk in 0..chunks {
            let range = clip(&(0..buffer.len()), chunk, chunk_elements);
            if is_root {
                let mut slot = self.send_slot::<T>(Stream::Raw, range.len())?;
                slot.copy_from_slice(&buffer[range]);
                self.post(Stream::Raw, slot);
                continue;
            }
            let incoming = self.receive::<T>(Stream::Raw, range.len())?;
            buffer[range.clone()].copy_from_slice(&incoming);
            if chain.forwards(self.rank) {
                let mut slot = self.send_slot::<T>(Stream::Raw, range.len())?;
                slot.copy_from_slice(&incoming);
                self.post(Stream::Raw, slot);
            }
            self.release(Stream::Raw, incoming);
        }
        Ok(())
    }
}
