//! How the ranks of a CUDA communicator agree on a step that may fail on
//! some of them only: each says over the control plane whether it failed,
//! and all learn the highest rank that did, so every rank takes the same
//! path (or reports the same failure) instead of timing out.

use crate::engine::{Communicator, EngineError, ReduceOp};

/// The highest rank that failed (`failed` here), the same on every rank;
/// `None` when none did. Collective.
pub(super) fn highest_failing_rank(
    control: &mut Communicator,
    failed: bool,
) -> Result<Option<usize>, EngineError> {
    let mut word = [if failed { control.rank() as i64 + 1 } else { 0 }];
    control.all_reduce_in_place(&mut word, ReduceOp::Max)?;
    Ok(usize::try_from(word[0] - 1).ok())
}

/// Every rank's view of `outcome`: `Ok` where it succeeded everywhere, else
/// the failure (this rank's own, or `PeerGpuFailed` naming the highest
/// failing rank). Collective.
pub(super) fn agree<T>(
    control: &mut Communicator,
    outcome: Result<T, EngineError>,
) -> Result<Result<T, EngineError>, EngineError> {
    let failing = highest_failing_rank(control, outcome.is_err())?;
    Ok(match (outcome, failing) {
        (outcome, None) => outcome,
        (Err(own), _) => Err(own),
        (Ok(_), Some(rank)) => Err(EngineError::PeerGpuFailed { rank }),
    })
}
