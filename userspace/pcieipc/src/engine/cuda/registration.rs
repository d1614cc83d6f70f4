//! Buffers registered on every rank, so that peers read a user's input
//! directly instead of through staging.

use super::communicator::{on_rank, CudaCommunicator, DataPath};
use std::sync::Arc;

use super::gpu::{Allocation, DeviceBuffer};
use super::ipc::{self, PeerMemory, HANDLE_WORDS};
use crate::engine::{Element, EngineError, ReduceOp};

/// A buffer registered on every rank: peers' mappings of their counterparts.
pub(super) struct Registration {
    pub(super) bytes: usize,
    pub(super) peers: Vec<Option<PeerMemory>>,
    /// The registered memory, kept allocated while peers may map it: a
    /// buffer dropped while registered is freed at deregistration, so its
    /// address is never reused (and read through a stale mapping) before.
    _allocation: Arc<Allocation>,
}

impl CudaCommunicator {
    /// Registers `buffer` for direct peer reads: later all_reduce calls whose
    /// input it is skip the copy into staging. Collective: every rank
    /// registers its counterpart buffer, in the same order. A buffer dropped
    /// while registered stays allocated until it is deregistered (or the
    /// communicator drops), so peers never map freed or reused memory.
    pub fn register<T: Element>(&mut self, buffer: &DeviceBuffer<T>) -> Result<(), EngineError> {
        let err = on_rank(self.rank);
        let bytes = buffer.len() * std::mem::size_of::<T>();
        let mut mine = [0i64; HANDLE_WORDS + 1];
        mine[0] = bytes as i64;
        if self.path == DataPath::PeerToPeer {
            mine[1..].copy_from_slice(&ipc::export(&self.gpu, buffer.address()).map_err(&err)?);
        }
        let mut all = vec![0i64; (HANDLE_WORDS + 1) * self.nranks];
        self.control.all_gather(&mine, &mut all)?;
        let mut peers = Vec::with_capacity(self.nranks);
        for (peer, words) in all.chunks_exact(HANDLE_WORDS + 1).enumerate() {
            if words[0] != bytes as i64 {
                return Err(EngineError::MismatchedRegistration {
                    rank: self.rank,
                    peer,
                    detail: format!("{bytes} bytes here, {} bytes there", words[0]),
                });
            }
            let open = peer != self.rank && self.path == DataPath::PeerToPeer;
            peers.push(if open {
                let handle = words[1..].try_into().expect("HANDLE_WORDS words");
                Some(PeerMemory::open(&self.gpu, handle).map_err(&err)?)
            } else {
                None
            });
        }
        self.registered.insert(
            buffer.address(),
            Registration {
                bytes,
                peers,
                _allocation: buffer.allocation(),
            },
        );
        Ok(())
    }

    /// Closes the peers' mappings of `buffer`. Collective, like `register`.
    pub fn deregister<T: Element>(&mut self, buffer: &DeviceBuffer<T>) -> Result<(), EngineError> {
        // Nobody may still read it: every rank reaches this point first.
        let mut barrier = [0u8];
        self.control
            .all_reduce_in_place(&mut barrier, ReduceOp::Max)?;
        self.registered.remove(&buffer.address());
        Ok(())
    }
}
