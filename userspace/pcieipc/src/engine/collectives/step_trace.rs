//! The steps of a host collective on the rank's trace.

use crate::engine::comm::peers::Peers;
use crate::trace::Arg;

/// When a step begins, where the rank traces.
pub(super) fn step_start(peers: &Peers) -> Option<u64> {
    peers.trace.as_ref().map(|_| crate::trace::monotonic_ns())
}

/// Records a step that began at `traced_from` (None: not tracing): step
/// (or round) `k` of chunk `chunk`, `bytes` from the predecessor (or, for a
/// send, into this rank's slot). The waits inside it name the peer.
pub(super) fn trace_step(
    peers: &Peers,
    name: &'static str,
    traced_from: Option<u64>,
    k: usize,
    chunk: usize,
    bytes: usize,
) {
    if let (Some(trace), Some(start)) = (&peers.trace, traced_from) {
        trace.span(
            name,
            "step",
            start,
            [
                ("step", Arg::Int(k as i64)),
                ("chunk", Arg::Int(chunk as i64)),
                ("bytes", Arg::Int(bytes as i64)),
            ],
        );
    }
}
