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
/// the two one-shot buffers, alternated between rounds. Built only by `new`,
/// whose checked total bounds every offset below.
#[derive(Clone, Copy, Debug)]
pub(super) struct StagingLayout {
    slot_bytes: usize,
    steps: usize,
    one_shot_bytes: usize,
    total: usize,
}

impl StagingLayout {
    /// The layout of `steps` ring steps' slots of `slot_bytes` and two
    /// one-shot buffers of `one_shot_bytes`; `None` where the block would
    /// not fit the address space. The sizes come from rank 0.
    pub(super) fn new(
        slot_bytes: usize,
        steps: usize,
        one_shot_bytes: usize,
    ) -> Option<StagingLayout> {
        let slots = steps.checked_mul(2)?.checked_mul(slot_bytes)?;
        let total = one_shot_bytes.checked_mul(2)?.checked_add(slots)?;
        Some(StagingLayout {
            slot_bytes,
            steps,
            one_shot_bytes,
            total,
        })
    }

    /// Bytes of each ring slot: a chunk.
    pub(super) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes of each one-shot buffer: the one-shot budget.
    pub(super) fn one_shot_bytes(&self) -> usize {
        self.one_shot_bytes
    }

    pub(super) fn slot(&self, step: usize, parity: usize) -> usize {
        assert!(step < self.steps && parity < 2, "slot ({step}, {parity})");
        (step * 2 + parity) * self.slot_bytes
    }

    pub(super) fn one_shot(&self, parity: usize) -> usize {
        assert!(parity < 2, "one-shot buffer {parity}");
        self.steps * 2 * self.slot_bytes + parity * self.one_shot_bytes
    }

    /// Bytes of the whole block: what every rank allocates, and what each
    /// reads and writes of its peers'.
    pub(super) fn total(&self) -> usize {
        self.total
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

/// Whether peer-to-peer works between this rank and every peer.
pub(super) enum PeerToPeerCheck {
    Passed,
    /// Why it does not: the ranks then go through host memory.
    Failed {
        reason: String,
    },
}

/// A peer whose staging block is smaller than the layout every rank
/// allocates. Not a sign that peer-to-peer fails here: the peer is hostile
/// or broken, and no path is safe with it.
#[derive(Debug)]
pub(super) struct UndersizedPeerBlock {
    pub(super) peer: usize,
    pub(super) error: CudaError,
}

impl Staging {
    /// Bytes of every rank's block for `layout`: the check pattern needs
    /// its room even where the layout is smaller.
    fn block_bytes(layout: StagingLayout) -> usize {
        layout.total().max(CHECK_BYTES)
    }

    /// Allocates rank `rank`'s block (with its check pattern) and exports
    /// it: the handle every peer opens.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        layout: StagingLayout,
        rank: usize,
        nranks: usize,
    ) -> Result<(Staging, [i64; HANDLE_WORDS]), CudaError> {
        let block = DeviceBuffer::<u8>::zeroed(gpu, Staging::block_bytes(layout))?;
        // SAFETY: the block holds at least CHECK_BYTES (`block_bytes`).
        unsafe { gpu.upload(block.address(), &check_pattern(rank)) }?;
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
    /// order) and reads its check pattern back.
    pub(super) fn open_peers(
        &mut self,
        rank: usize,
        handles: &[i64],
    ) -> Result<PeerToPeerCheck, UndersizedPeerBlock> {
        let failed = |reason: String| Ok(PeerToPeerCheck::Failed { reason });
        let nranks = self.peers.len();
        let scratch = match DeviceBuffer::<u8>::zeroed(&self.gpu, CHECK_BYTES * nranks) {
            Ok(scratch) => scratch,
            Err(error) => return failed(error.to_string()),
        };
        let needed = Staging::block_bytes(self.layout);
        for peer in (0..nranks).filter(|peer| *peer != rank) {
            let memory =
                match PeerMemory::open(&self.gpu, peer, ipc::handle_of(handles, peer), needed) {
                    Ok(memory) => memory,
                    Err(error @ CudaError::PeerAllocationTooSmall { .. }) => {
                        return Err(UndersizedPeerBlock { peer, error })
                    }
                    Err(error) => return failed(format!("opening rank {peer}'s memory: {error}")),
                };
            if let Err(error) = self.gpu.copy(
                scratch.address() + (peer * CHECK_BYTES) as u64,
                memory.address(),
                CHECK_BYTES,
            ) {
                return failed(format!("reading rank {peer}'s memory: {error}"));
            }
            self.peers[peer] = Some(memory);
        }
        let seen = match scratch.to_host() {
            Ok(seen) => seen,
            Err(error) => return failed(error.to_string()),
        };
        for peer in (0..nranks).filter(|peer| *peer != rank) {
            if seen[peer * CHECK_BYTES..][..CHECK_BYTES] != check_pattern(peer)[..] {
                return failed(format!(
                    "rank {peer}'s check pattern read over peer-to-peer came back wrong"
                ));
            }
        }
        Ok(PeerToPeerCheck::Passed)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_fall_within_the_total() {
        let layout = StagingLayout::new(1 << 20, 6, 256 << 10).unwrap();
        assert_eq!(layout.total(), 12 * (1 << 20) + 2 * (256 << 10));
        assert_eq!(layout.slot(5, 1) + layout.slot_bytes(), layout.one_shot(0));
        assert_eq!(layout.one_shot(1) + layout.one_shot_bytes(), layout.total());
    }

    #[test]
    fn a_layout_past_the_address_space_is_refused() {
        // What a hostile rank 0 could ask for before its sizes were bounded:
        // the total wrapped, and the one-shot path copied past the block.
        for (slot_bytes, steps, one_shot_bytes) in [
            (1 << 62, 2, 16),
            (usize::MAX - 15, 2, 16),
            (16, usize::MAX / 2 + 1, 16),
            (16, 2, usize::MAX - 15),
            (16, 2, usize::MAX / 2),
            (1 << 61, 2, 1 << 62),
        ] {
            assert!(
                StagingLayout::new(slot_bytes, steps, one_shot_bytes).is_none(),
                "{slot_bytes} {steps} {one_shot_bytes}"
            );
        }
        assert!(StagingLayout::new(0, 0, 0).is_some_and(|layout| layout.total() == 0));
    }
}
