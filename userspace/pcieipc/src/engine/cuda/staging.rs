//! The host hand-off's staging blocks: each rank's block of ring slots and
//! one-shot buffers (cuMemAlloc'd, exported by legacy IPC), and every
//! peer's block as mapped here, opened once at init and checked by reading
//! a pattern back over peer-to-peer.

use std::sync::Arc;

use super::error::CudaError;
use super::gpu::Gpu;
use super::ipc::{self, PeerMemory, HANDLE_WORDS};
use super::memory::DeviceBuffer;

/// Where things sit in a rank's staging block: for each ring step k two slots
/// (the message of step k for chunk c lives in slot (k, (c + k) mod 2), so a
/// slot is rewritten only two barriers after its reader has used it), then
/// the two one-shot buffers, alternated between rounds.
#[derive(Clone, Copy, Debug)]
pub(super) struct StagingLayout {
    pub(super) slot_bytes: usize,
    pub(super) steps: usize,
    pub(super) one_shot_bytes: usize,
}

impl StagingLayout {
    pub(super) fn slot(&self, step: usize, parity: usize) -> usize {
        (step * 2 + parity) * self.slot_bytes
    }

    pub(super) fn one_shot(&self, parity: usize) -> usize {
        self.steps * 2 * self.slot_bytes + parity * self.one_shot_bytes
    }

    fn total(&self) -> usize {
        self.one_shot(2)
    }
}

/// Bytes at the start of each staging block written with a rank-specific
/// pattern at init and read back by every peer (the peer-to-peer check).
const CHECK_BYTES: usize = 4096;

fn check_pattern(rank: usize) -> Vec<u8> {
    (0..CHECK_BYTES)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(rank as u8 * 101 + 7)
        })
        .collect()
}

/// This rank's staging block and its peers' as mapped here.
pub(super) struct Staging {
    gpu: Arc<Gpu>,
    pub(super) layout: StagingLayout,
    block: DeviceBuffer<u8>,
    /// Each peer's block (`None` at our own rank, and everywhere without
    /// peer-to-peer).
    peers: Vec<Option<PeerMemory>>,
}

impl Staging {
    /// Allocates rank `rank`'s block (with its check pattern) and exports
    /// it: the handle every peer opens.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        layout: StagingLayout,
        rank: usize,
        nranks: usize,
    ) -> Result<(Staging, [i64; HANDLE_WORDS]), CudaError> {
        let mut block = DeviceBuffer::<u8>::zeroed(gpu, layout.total().max(CHECK_BYTES))?;
        let mut check = vec![0u8; block.len()];
        check[..CHECK_BYTES].copy_from_slice(&check_pattern(rank));
        block.copy_from_host(&check)?;
        let handle = ipc::export(gpu, block.address())?;
        let staging = Staging {
            gpu: gpu.clone(),
            layout,
            block,
            peers: (0..nranks).map(|_| None).collect(),
        };
        Ok((staging, handle))
    }

    /// Opens every peer's block from `handles` (every rank's, in rank
    /// order) and reads its check pattern back. Returns why peer-to-peer
    /// cannot be used, if it cannot.
    pub(super) fn open_peers(&mut self, rank: usize, handles: &[i64]) -> Result<(), String> {
        let nranks = self.peers.len();
        let scratch = DeviceBuffer::<u8>::zeroed(&self.gpu, CHECK_BYTES * nranks)
            .map_err(|error| error.to_string())?;
        for peer in (0..nranks).filter(|peer| *peer != rank) {
            let memory = PeerMemory::open(&self.gpu, ipc::handle_of(handles, peer))
                .map_err(|error| format!("opening rank {peer}'s memory: {error}"))?;
            self.gpu
                .copy(
                    scratch.address() + (peer * CHECK_BYTES) as u64,
                    memory.address(),
                    CHECK_BYTES,
                )
                .map_err(|error| format!("reading rank {peer}'s memory: {error}"))?;
            self.peers[peer] = Some(memory);
        }
        let seen = scratch.to_host().map_err(|error| error.to_string())?;
        for peer in (0..nranks).filter(|peer| *peer != rank) {
            if seen[peer * CHECK_BYTES..][..CHECK_BYTES] != check_pattern(peer)[..] {
                return Err(format!(
                    "rank {peer}'s check pattern read over peer-to-peer came back wrong"
                ));
            }
        }
        Ok(())
    }

    /// Closes every peer's block: the ranks go without peer-to-peer.
    pub(super) fn close_peers(&mut self) {
        self.peers.iter_mut().for_each(|peer| *peer = None);
    }

    /// `offset` in this rank's block.
    pub(super) fn own(&self, offset: usize) -> u64 {
        self.block.address() + offset as u64
    }

    /// `offset` in `peer`'s block, as mapped here.
    pub(super) fn peer(&self, peer: usize, offset: usize) -> u64 {
        self.peers[peer]
            .as_ref()
            .expect("peer-to-peer path: every peer's staging block is open")
            .address()
            + offset as u64
    }
}
