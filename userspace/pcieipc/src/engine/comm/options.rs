//! What a rank chooses when it joins a communicator.

use std::time::Duration;

use crate::engine::cache_bypass::StreamingStores;
use crate::engine::chunk::{ChunkPolicy, LinkFacts};
use crate::engine::schedule::AlgorithmChoice;
use crate::engine::transport::{JobSecret, TransportOptions};

/// An empty range of message sizes: no size goes direct unless asked.
#[allow(clippy::reversed_empty_ranges)]
const DIRECT_NEVER: std::ops::RangeInclusive<usize> = 1..=0;

/// Everything a rank chooses when it joins. Rank 0's window sizes (chunk
/// policy's largest chunk, `in_flight`, `one_shot_read_budget`) are the ones the
/// segment is built with; the per-call choices are checked across ranks.
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// The transport and its own options (the registry's names parse into
    /// it: `"pcieipc".parse()`).
    pub transport: TransportOptions,
    /// The job's secret: the launcher makes one (`JobSecret::generate`) and
    /// hands it to every rank (`PCIEIPC_JOB_SECRET`: `JobSecret::from_env`);
    /// the rendezvous admits only ranks that present it. `None`: ranks are
    /// still only this user's processes.
    pub secret: Option<JobSecret>,
    /// How long the rendezvous (and init's agreements after it) waits for
    /// every rank.
    pub join_timeout: Duration,
    /// How long a rank waits on one peer inside a collective before it names
    /// that peer (or the peer that one waits for) as unresponsive.
    pub peer_timeout: Duration,
    /// How long a waiting rank polls before it sleeps on the futex: a short
    /// spin hides the wake-up latency when the peer is only slightly late.
    pub spin: Duration,
    pub chunk_policy: ChunkPolicy,
    /// The link under this rank's ring hop at init (`None`: host memory),
    /// changed later with `set_link`. A transport with link events follows
    /// its device's link instead.
    pub link: Option<LinkFacts>,
    /// The PCI function this rank's data crosses (a GPU or NIC bound to its
    /// vendor driver), where the transport follows no device of its own:
    /// with `PCIEIPC_LINK_TRACEFS` set, its AER errors and its link are
    /// followed through the kernel's tracepoints and acted on by the same
    /// AER → action matrix (docs/fault-path.md), from `link` as it was at
    /// init.
    pub link_device: Option<crate::engine::LinkDevice>,
    /// How many chunks each ring step may run ahead of the next (the slack
    /// between neighbours); the windows hold in_flight + 1 chunks per step.
    pub in_flight: usize,
    pub algorithm: AlgorithmChoice,
    /// The most bytes a rank reads from its peers on the one-shot path:
    /// all_reduce of `bytes` goes one-shot while bytes·(N−1) fits. 16 KiB by
    /// default: above it the ring measured level or ahead on both an Intel
    /// Xeon and an AMD EPYC (docs/engine.md, Choice).
    pub one_shot_read_budget: usize,
    /// Binds the calling thread to this CPU at init, as MPI launchers bind
    /// ranks to cores: two ranks time-sharing one core turn every wait into a
    /// context switch.
    pub bind_cpu: Option<usize>,
    /// Where the transport has peer reads: let the ring's all-gather copy
    /// each finished chunk once, straight from the predecessor's output,
    /// where every rank may read its predecessor's memory (probed at init;
    /// all ranks agree), and let the direct algorithm run. False on any
    /// rank: every rank copies twice, through the relay slots, as on
    /// transports without peer reads.
    pub single_copy: bool,
    /// The all_reduce (and reduce_scatter, all_gather) message sizes, in
    /// bytes of the whole buffer, that take the single-copy path where it is
    /// on: elsewhere the relay slots measured faster on the 2-core
    /// development VM (docs/engine.md). Must be the same on every rank
    /// (checked at init: ranks that differ all fall back to the relay slots).
    pub single_copy_messages: std::ops::RangeInclusive<usize>,
    /// The all_reduce message sizes, in bytes, that the automatic choice
    /// sends by the direct algorithm where single-copy reads are on (each
    /// rank reduces its own segment from every peer's input, then copies the
    /// others' from their owners). None by default: at 4–16 MiB, where it
    /// came closest, the direct algorithm measured within 2% of the ring on
    /// an Intel Xeon and 11–39% behind it on an AMD EPYC (docs/engine.md), so
    /// the ring serves both. Agreed at init like `single_copy_messages`.
    pub direct_messages: std::ops::RangeInclusive<usize>,
    /// When the ring's first step fills its slots with non-temporal stores:
    /// from a working set (every rank's input, and output when out of place,
    /// together) the cache cannot keep until the successor reads it. A
    /// rank's own choice: its peers read the slots the same either way.
    pub streaming_stores: StreamingStores,
    /// Bytes of each rank's backend area in the segment (0: none; rank 0's
    /// value is used): memory the engine leaves to a backend layered on the
    /// communicator ([`backend_area`](crate::engine::Communicator::backend_area)).
    pub backend_bytes: usize,
    /// Records this rank's timeline into `<prefix>.rank<R>.json` (trace-event
    /// JSON: `crate::trace`). `None`: the `PCIEIPC_TRACE` environment
    /// variable's prefix, if it is set; otherwise nothing is recorded.
    pub trace: Option<std::path::PathBuf>,
    /// After the kernel recovered this rank's device from a non-fatal error,
    /// retrain its link where it reads degraded (below its maximum speed or
    /// width), and plan the next calls' chunk for the speed it trains to.
    /// Opt-in: a link is down while it trains, and the retrain needs
    /// `CAP_SYS_ADMIN`.
    pub retrain_degraded: bool,
    /// Chunk checksums (docs/fault-path.md): every message carries a
    /// checksum of its data, its receiver checks it on a host copy, reads
    /// it again and has it resent while it is damaged. `None`: on where the
    /// transport's windows are device memory (the data crosses PCIe links),
    /// off in host memory. Must be alike on every rank: a rank that receives
    /// messages otherwise fails the call with `PeerCorrupt`.
    pub chunk_checksums: Option<bool>,
    /// For tests of the checksums: damages one chunk this rank sends (needs
    /// them on).
    pub damage: Option<crate::engine::DamageInjection>,
}

impl Default for CommOptions {
    fn default() -> CommOptions {
        CommOptions {
            transport: TransportOptions::default(),
            secret: None,
            join_timeout: Duration::from_secs(30),
            peer_timeout: Duration::from_secs(60),
            spin: Duration::from_micros(50),
            chunk_policy: ChunkPolicy::default(),
            link: None,
            link_device: None,
            in_flight: 4,
            algorithm: AlgorithmChoice::Auto,
            one_shot_read_budget: 16 << 10,
            bind_cpu: None,
            single_copy: true,
            single_copy_messages: (2 << 20)..=(16 << 20),
            direct_messages: DIRECT_NEVER,
            streaming_stores: StreamingStores::Auto,
            backend_bytes: 0,
            trace: None,
            retrain_degraded: false,
            chunk_checksums: None,
            damage: None,
        }
    }
}
