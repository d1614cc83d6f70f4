//! Buffers registered on every rank, so that peers read a user's input
//! directly instead of through staging: each rank exports its buffer's IPC
//! handle, and every peer opens it once and keeps it until deregistration.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::{on_rank, CudaError};
use super::gpu::Gpu;
use super::ipc::{self, PeerMemory, HANDLE_WORDS};
use super::memory::{Allocation, DeviceBuffer};
use crate::engine::{Communicator, Element, EngineError, ReduceOp};

/// A buffer registered on every rank: peers' mappings of their counterparts.
struct Registration {
    bytes: usize,
    peers: Vec<Option<PeerMemory>>,
    /// The registered memory, kept allocated while peers may map it: a
    /// buffer dropped while registered is freed at deregistration, so its
    /// address is never reused (and read through a stale mapping) before.
    _allocation: Arc<Allocation>,
}

/// The registered buffers of one communicator, by their address here.
#[derive(Default)]
pub(super) struct Registrations {
    by_address: HashMap<u64, Registration>,
}

impl Registrations {
    /// Registers `buffer` with every rank over `control` (collective: every
    /// rank registers its counterpart, in the same order); peers' handles
    /// are opened only `over_peer_to_peer`.
    pub(super) fn register<T: Element>(
        &mut self,
        control: &mut Communicator,
        gpu: &Arc<Gpu>,
        over_peer_to_peer: bool,
        buffer: &DeviceBuffer<T>,
    ) -> Result<(), EngineError> {
        let (rank, nranks) = (control.rank(), control.nranks());
        let err = on_rank(rank);
        let bytes = buffer.len() * std::mem::size_of::<T>();
        let mut mine = [0i64; HANDLE_WORDS + 1];
        mine[0] = bytes as i64;
        if over_peer_to_peer {
            mine[1..].copy_from_slice(&ipc::export(gpu, buffer.address()).map_err(&err)?);
        }
        let mut all = vec![0i64; (HANDLE_WORDS + 1) * nranks];
        control.all_gather(&mine, &mut all)?;
        let mut peers = Vec::with_capacity(nranks);
        for (peer, words) in all.chunks_exact(HANDLE_WORDS + 1).enumerate() {
            if words[0] != bytes as i64 {
                return Err(EngineError::MismatchedRegistration {
                    rank,
                    peer,
                    detail: format!("{bytes} bytes here, {} bytes there", words[0]),
                });
            }
            let open = peer != rank && over_peer_to_peer;
            peers.push(if open {
                // The ring reads up to `bytes` of the peer's counterpart.
                match PeerMemory::open(gpu, peer, ipc::handle_of(&words[1..], 0), bytes) {
                    Ok(memory) => Some(memory),
                    // The peer claims the bytes but shares less.
                    Err(error @ CudaError::PeerAllocationTooSmall { .. }) => {
                        return Err(EngineError::MismatchedRegistration {
                            rank,
                            peer,
                            detail: error.to_string(),
                        })
                    }
                    Err(error) => return Err(err(error)),
                }
            } else {
                None
            });
        }
        self.by_address.insert(
            buffer.address(),
            Registration {
                bytes,
                peers,
                _allocation: buffer.allocation(),
            },
        );
        Ok(())
    }

    /// Closes the peers' mappings of `buffer` once every rank has come here
    /// (collective, like `register`).
    pub(super) fn deregister<T: Element>(
        &mut self,
        control: &mut Communicator,
        buffer: &DeviceBuffer<T>,
    ) -> Result<(), EngineError> {
        // Nobody may still read it: every rank reaches this point first.
        let mut barrier = [0u8];
        control.all_reduce_in_place(&mut barrier, ReduceOp::Max)?;
        self.by_address.remove(&buffer.address());
        Ok(())
    }

    /// Whether the `bytes` at `input` lie in a registered buffer that starts
    /// there.
    pub(super) fn covers(&self, input: u64, bytes: usize) -> bool {
        self.by_address
            .get(&input)
            .is_some_and(|registration| registration.bytes >= bytes)
    }

    /// `peer`'s counterpart of the registered buffer at `input`, as mapped
    /// here (open on the peer-to-peer path).
    pub(super) fn peer_address(&self, input: u64, peer: usize) -> Option<u64> {
        let registration = self.by_address.get(&input)?;
        registration.peers[peer].as_ref().map(PeerMemory::address)
    }
}
