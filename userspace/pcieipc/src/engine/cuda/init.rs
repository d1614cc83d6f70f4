//! Joining a CUDA communicator: the host control plane, rank 0's geometry
//! and hand-off, the staging blocks and the peer-to-peer check, and the GPU
//! hand-off where every rank may take it. Every choice is agreed over the
//! control plane, so all ranks take the same path.

use std::sync::Arc;
use std::time::Instant;

use super::agreement::{agree, highest_failing_rank};
use super::communicator::CudaCommunicator;
use super::error::on_rank;
use super::gpu::Gpu;
use super::gpu_handoff::{
    ExchangeMemory, GpuHandoff, HandoffSettings, DEFAULT_COPY_CHUNK_BYTES,
    DEFAULT_COPY_ENGINES_FROM,
};
use super::host_handoff::HostHandoff;
use super::ipc::HANDLE_WORDS;
use super::kernels::{HANDOFF_BLOCKS, HANDOFF_MAX_RANKS};
use super::options::{
    CopyEnginePlan, CudaOptions, DataPath, Handoff, PeerToPeer, DEFAULT_ONE_SHOT_READ_BYTES,
};
use super::registration::Registrations;
use super::staging::{PeerToPeerCheck, Staging, StagingLayout, UndersizedPeerBlock};
use crate::engine::{Algorithm, AlgorithmChoice, CommOptions, Communicator, EngineError};

/// What a two-shot launch of the GPU hand-off carries by default.
const HANDOFF_LAUNCH_BYTES: usize = 32 << 20;

/// The largest hand-off window a rank accepts from rank 0.
const MAX_HANDOFF_WINDOW: usize = 1 << 30;

/// The largest ring chunk (staging slot) a rank accepts from rank 0: 64
/// times the default, and small enough that no staging offset can overflow
/// and that a chunk's byte count fits the call descriptor's 32 bits.
const MAX_STAGING_SLOT_BYTES: usize = 1 << 30;

/// The largest one-shot buffer (one-shot budget) a rank accepts from rank 0:
/// 4096 times the default, bounded for the same reasons.
const MAX_ONE_SHOT_BYTES: usize = 1 << 30;

/// Rank 0's word for "one-shot budget unset: the path's default".
const ONE_SHOT_DEFAULT: i64 = -1;

/// Rank 0's word for its `one_shot_read_budget`: `ONE_SHOT_DEFAULT` when
/// unset, else the bytes as they wrap into an i64, so that a peer refusing
/// a size too large shows it as set (`word as u64`). The one size that
/// would wrap onto `ONE_SHOT_DEFAULT`, `usize::MAX`, goes as `i64::MIN`:
/// refused too, never read as unset.
fn one_shot_word(budget: Option<usize>) -> i64 {
    match budget.map(|bytes| bytes as i64) {
        None => ONE_SHOT_DEFAULT,
        Some(ONE_SHOT_DEFAULT) => i64::MIN,
        Some(word) => word,
    }
}

/// Rank 0's word for "through host memory, never by the copy engines".
const COPY_ENGINES_NEVER: i64 = -1;

/// Rank 0's `word` of staging bytes when within `0..=max`, rounded up to a
/// multiple of 16 (at least 16), which keeps chunk boundaries on the
/// kernels' vector width. `max` is a multiple of 16, so the result is at
/// most `max`.
fn staging_bytes(word: i64, max: usize) -> Option<usize> {
    usize::try_from(word)
        .ok()
        .filter(|bytes| *bytes <= max)
        .map(|bytes| bytes.max(16).next_multiple_of(16))
}

impl CudaCommunicator {
    /// Joins `rendezvous` as `rank` of `nranks` on `gpu`: the host control
    /// plane, the staging blocks and their IPC handles, the peer-to-peer
    /// check, and the GPU hand-off where it is taken. Collective: every
    /// rank calls it.
    pub fn init(
        rendezvous: &str,
        rank: usize,
        nranks: usize,
        gpu: Arc<Gpu>,
        options: CudaOptions,
    ) -> Result<CudaCommunicator, EngineError> {
        let started = Instant::now();
        let window = options
            .handoff_window
            .unwrap_or(HANDOFF_LAUNCH_BYTES / nranks.max(1))
            .max(16)
            .next_multiple_of(16);
        // The GPU hand-off through host memory keeps its exchange blocks in
        // the control plane's segment, which is made at the rendezvous: ask
        // for the room whenever that path may be taken (memfd pages cost
        // nothing until touched). Rank 0's request is the one granted.
        let may_hand_off_through_host = options.handoff != Handoff::Host
            && nranks <= HANDOFF_MAX_RANKS
            && !options.control.transport.capabilities().device_memory;
        let control_options = CommOptions {
            backend_bytes: if may_hand_off_through_host {
                GpuHandoff::bytes(nranks, window)
            } else {
                0
            },
            ..options.control.clone()
        };
        let mut control = Communicator::init(rendezvous, rank, nranks, control_options)?;
        let err = on_rank(rank);
        // Rank 0's geometry and hand-off: every rank computes offsets in its
        // peers' blocks, and all must take the same path.
        let copy_engines_from = match options
            .copy_engines_from
            .unwrap_or(DEFAULT_COPY_ENGINES_FROM)
        {
            usize::MAX => COPY_ENGINES_NEVER,
            bytes => i64::try_from(bytes).unwrap_or(i64::MAX),
        };
        let mut geometry = [
            options.chunk_bytes as i64,
            one_shot_word(options.one_shot_read_budget),
            window as i64,
            options.handoff as i64,
            copy_engines_from,
            options
                .copy_chunk_bytes
                .unwrap_or(DEFAULT_COPY_CHUNK_BYTES)
                .try_into()
                .unwrap_or(i64::MAX),
        ];
        control.broadcast(&mut geometry, 0)?;
        let refused = |reason: String| EngineError::RendezvousProtocol {
            name: rendezvous.to_owned(),
            rank: 0,
            reason,
        };
        let handoff = Handoff::from_word(geometry[3])
            .ok_or_else(|| refused(format!("hand-off {} (0 to 2)", geometry[3])))?;
        let window = usize::try_from(geometry[2])
            .ok()
            .filter(|window| {
                (16..=MAX_HANDOFF_WINDOW).contains(window) && window.is_multiple_of(16)
            })
            .ok_or_else(|| {
                refused(format!(
                    "hand-off window of {} bytes (a multiple of 16 up to {MAX_HANDOFF_WINDOW})",
                    geometry[2]
                ))
            })?;
        let copy_engines_from = match geometry[4] {
            COPY_ENGINES_NEVER => usize::MAX,
            word => usize::try_from(word).map_err(|_| {
                refused(format!(
                    "copy engines from {word} bytes (0 or more, or {COPY_ENGINES_NEVER}: never)"
                ))
            })?,
        };
        let copy_chunk_bytes = usize::try_from(geometry[5])
            .ok()
            .filter(|bytes| (16..=MAX_HANDOFF_WINDOW).contains(bytes))
            .ok_or_else(|| {
                refused(format!(
                    "copy-engine chunk of {} bytes (16 to {MAX_HANDOFF_WINDOW})",
                    geometry[5]
                ))
            })?;
        // Every rank allocates its staging block from these sizes and reads
        // and writes its peers' by them: bounded, so that no offset wraps.
        // A value is shown as rank 0 set it (a usize).
        let slot_bytes = staging_bytes(geometry[0], MAX_STAGING_SLOT_BYTES).ok_or_else(|| {
            refused(format!(
                "chunk of {} bytes (0 to {MAX_STAGING_SLOT_BYTES})",
                geometry[0] as u64
            ))
        })?;
        let one_shot_budget = match geometry[1] {
            ONE_SHOT_DEFAULT => None,
            word => Some(staging_bytes(word, MAX_ONE_SHOT_BYTES).ok_or_else(|| {
                refused(format!(
                    "one-shot budget of {} bytes (0 to {MAX_ONE_SHOT_BYTES})",
                    word as u64
                ))
            })?),
        };
        let one_shot_bytes = one_shot_budget.unwrap_or(DEFAULT_ONE_SHOT_READ_BYTES);
        let steps = 2 * nranks.saturating_sub(1);
        let layout = StagingLayout::new(slot_bytes, steps, one_shot_bytes).ok_or_else(|| {
            refused(format!(
                "staging of {steps} steps' slots of {slot_bytes} bytes and one-shot buffers of \
                 {one_shot_bytes} bytes, past the address space"
            ))
        })?;
        let (mut staging, handle) = Staging::new(&gpu, layout, rank, nranks).map_err(&err)?;
        let mut handles = vec![0i64; HANDLE_WORDS * nranks];
        control.all_gather(&handle, &mut handles)?;
        let reason = match options.peer_to_peer {
            PeerToPeer::Off => Some("peer-to-peer turned off".to_owned()),
            PeerToPeer::Auto => match staging.open_peers(rank, &handles) {
                Ok(PeerToPeerCheck::Passed) => None,
                Ok(PeerToPeerCheck::Failed { reason }) => Some(reason),
                // Failed at once, without the agreement below: the peer may
                // never come to it, and every honest rank opens the same
                // block and so fails alike.
                Err(UndersizedPeerBlock { peer, error }) => {
                    return Err(EngineError::RendezvousProtocol {
                        name: rendezvous.to_owned(),
                        rank: peer,
                        reason: format!("a staging block too small for the agreed layout: {error}"),
                    })
                }
            },
        };
        // Every rank must take the same path: any failed check sends all to
        // the host. The highest failing rank's reason is the one reported.
        let mut path = DataPath::PeerToPeer;
        if let Some(failing) = highest_failing_rank(&mut control, reason.is_some())? {
            staging.close_peers();
            path = DataPath::HostStaged {
                reason: reason
                    .unwrap_or_else(|| format!("rank {failing}'s peer-to-peer check failed")),
            };
        }
        let host_handoff = HostHandoff::new(
            &gpu,
            staging,
            options.algorithm,
            options.peer_read,
            options.gpu_poll,
            path != DataPath::PeerToPeer,
        )
        .map_err(&err)?;
        // The GPU hand-off needs a slot per rank in the kernels' argument
        // and (unless forced) a GPU per rank: ranks sharing one are
        // time-sliced, and each hand-off would wait for a slice. Every rank
        // learns the same facts, so all choose alike. The grid is the
        // smallest any rank proposes (at most its multiprocessors, and its
        // `handoff_blocks`): every rank's must be resident at once.
        let mut facts = vec![0i64; 2 * nranks];
        let address = gpu.pci_address().map_err(&err)?;
        let proposed = i64::from(
            options
                .handoff_blocks
                .map_or(u32::MAX, |blocks| blocks.max(1))
                .min(GpuHandoff::proposed_blocks(&gpu)),
        );
        control.all_gather(&[address, proposed], &mut facts)?;
        let distinct = {
            let mut addresses: Vec<i64> = facts.iter().step_by(2).copied().collect();
            addresses.sort_unstable();
            addresses.windows(2).all(|pair| pair[0] != pair[1])
        };
        let blocks = facts
            .iter()
            .skip(1)
            .step_by(2)
            .map(|&blocks| blocks.clamp(1, HANDOFF_BLOCKS as i64) as u32)
            .min()
            .unwrap_or(1);
        let ring = options.algorithm == AlgorithmChoice::Fixed(Algorithm::Ring);
        let on_gpu = nranks <= HANDOFF_MAX_RANKS
            && match handoff {
                Handoff::Auto => distinct && !ring,
                Handoff::Gpu => true,
                Handoff::Host => false,
            };
        if on_gpu && ring {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm: Algorithm::Ring,
                reason: "the GPU hand-off runs one-shot and direct (two-shot) kernels",
            });
        }
        let gpu_handoff = if on_gpu {
            let through_host = path != DataPath::PeerToPeer;
            let settings = HandoffSettings {
                memory: if through_host {
                    ExchangeMemory::Host
                } else {
                    ExchangeMemory::Device
                },
                window,
                blocks,
                timeout: options.handoff_timeout,
                algorithm: options.algorithm,
                one_shot_bytes: GpuHandoff::one_shot_bytes(one_shot_budget, through_host, nranks),
                copy_engines: CopyEnginePlan {
                    from_bytes: copy_engines_from,
                    chunk_bytes: copy_chunk_bytes,
                },
            };
            let outcome = GpuHandoff::open(&gpu, &mut control, settings);
            match agree(&mut control, outcome)? {
                Ok(opened) => {
                    if let DataPath::HostStaged { reason } = &path {
                        path = DataPath::HostMapped {
                            reason: reason.clone(),
                        };
                    }
                    Some(opened)
                }
                // Automatic: the host-staged path still works.
                Err(_) if through_host && handoff != Handoff::Gpu => None,
                Err(failure) => return Err(failure),
            }
        } else {
            None
        };
        if gpu_handoff.is_none() && options.algorithm == AlgorithmChoice::Fixed(Algorithm::Direct) {
            return Err(EngineError::AlgorithmUnavailable {
                algorithm: Algorithm::Direct,
                reason: "the direct all_reduce of device buffers needs the GPU hand-off",
            });
        }
        Ok(CudaCommunicator {
            gpu_handoff,
            host_handoff,
            registrations: Registrations::default(),
            control,
            gpu,
            rank,
            nranks,
            path,
            init_time: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_0s_staging_sizes_are_bounded_then_rounded_to_vectors() {
        for (word, bytes) in [
            (0, Some(16)),
            (1000, Some(1008)),
            (16 << 20, Some(16 << 20)),
            (1 << 30, Some(1 << 30)),
            ((1 << 30) + 1, None),
            (1 << 62, None),
            (i64::MAX, None),
            // usize::MAX - 7 as rank 0 broadcasts it.
            (-8, None),
        ] {
            assert_eq!(staging_bytes(word, MAX_STAGING_SLOT_BYTES), bytes, "{word}");
        }
    }

    #[test]
    fn an_unset_one_shot_budget_has_a_word_no_size_shares() {
        assert_eq!(one_shot_word(None), ONE_SHOT_DEFAULT);
        assert_eq!(one_shot_word(Some(256 << 10)), 256 << 10);
        // Sizes past i64 wrap, and are shown as set when refused.
        assert_eq!(one_shot_word(Some(usize::MAX - 7)) as u64, u64::MAX - 7);
        assert_ne!(one_shot_word(Some(usize::MAX)), ONE_SHOT_DEFAULT);
        for bytes in [usize::MAX - 7, usize::MAX, 1 << 63, (1 << 30) + 1] {
            let word = one_shot_word(Some(bytes));
            assert_eq!(staging_bytes(word, MAX_ONE_SHOT_BYTES), None, "{bytes}");
        }
    }
}
