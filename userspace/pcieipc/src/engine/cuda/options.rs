//! What a CUDA communicator is asked for at init, and the paths it can
//! take: how data moves between GPUs, whether peer-to-peer is tried, how a
//! ring step reads its predecessor, and where ranks hand over.

use std::time::Duration;

use crate::engine::{AlgorithmChoice, CommOptions};

/// How ranks move data between GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Kernels read peers' memory over peer-to-peer (or within one GPU).
    PeerToPeer,
    /// Kernels write and read pinned shared host memory over PCIe, handing
    /// over on the GPU: taken without peer-to-peer (`reason`) when every
    /// rank has a GPU of its own (or the GPU hand-off is forced).
    HostMapped { reason: String },
    /// Device → host, the shm transport's all_reduce, host → device, ranks
    /// meeting on the host: taken without peer-to-peer (`reason`) when the
    /// hand-off is on the host (ranks sharing a GPU, or asked for).
    HostStaged { reason: String },
}

/// Whether to try peer-to-peer at init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerToPeer {
    /// Use it when every pair passes the write-and-verify check.
    Auto,
    /// Always stage through host memory.
    Off,
}

/// How a reduce step gets the predecessor's chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRead {
    /// The reduce kernel loads it straight from the peer's memory.
    Direct,
    /// The copy engine brings it into a local buffer first, then the
    /// kernel reduces locally.
    CopyEngine,
}

/// The one-shot read budget where `CudaOptions::one_shot_read_budget` is
/// unset, but for the GPU hand-off through host memory; also the size of the
/// staging block's one-shot buffers then.
pub(crate) const DEFAULT_ONE_SHOT_READ_BYTES: usize = 256 << 10;

#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// The host control plane's options (its transport, rendezvous and peer
    /// timeouts, spin before sleeping, CPU binding).
    pub control: CommOptions,
    /// Bytes per ring chunk, one staging slot each. Rank 0's value is used.
    pub chunk_bytes: usize,
    /// all_reduce goes one-shot while bytes·(N−1) fits this budget (and N is
    /// at most 8); it is also the size of each one-shot buffer. `None`:
    /// `DEFAULT_ONE_SHOT_READ_BYTES`, and on the GPU hand-off through pinned
    /// host memory 1 MiB (`gpu_handoff::plan`). Rank 0's value is used.
    pub one_shot_read_budget: Option<usize>,
    pub algorithm: AlgorithmChoice,
    pub peer_to_peer: PeerToPeer,
    pub peer_read: PeerRead,
    /// How long a rank polls its GPU's completion event before it sleeps on
    /// it (the waits for peers are the control plane's, with its own spin).
    pub gpu_poll: Duration,
    /// Where ranks hand over: on the GPU (stream-ordered calls) or on the
    /// host after every step.
    pub handoff: Handoff,
    /// GPU hand-off: bytes of each inbox and result slot of the exchange
    /// blocks (a one-shot launch carries up to one, a two-shot launch one
    /// per rank). `None`: 32 MiB / N, so that a two-shot launch carries 32
    /// MiB and an exchange block takes 128 MiB whatever N (4 MiB windows
    /// were 17% behind the host hand-off at 128 MiB on one H200; 16 MiB
    /// level with it, 64 MiB ahead at four times the memory). Rank 0's
    /// value is used.
    pub handoff_window: Option<usize>,
    /// GPU hand-off: how long a kernel waits for a peer's flag before it
    /// fails the call (and the communicator) naming that peer.
    pub handoff_timeout: Duration,
    /// GPU hand-off: the most thread blocks a launch takes (1 to 64), the
    /// multiprocessors its kernels hold while they spin on their peers'
    /// flags, as NCCL's channels do: fewer leave more of the GPU to the
    /// job's own kernels running beside the calls. A launch takes a block
    /// per 32 KiB of its message up to this (an 8-byte call one block).
    /// `None`: one a multiprocessor, up to 64. The smallest any rank asks
    /// for holds (every rank's launches must be resident together).
    pub handoff_blocks: Option<u32>,
    /// GPU hand-off through host memory: a two-shot launch of at least this
    /// many bytes moves by the copy engines, a smaller one by the kernels'
    /// loads and stores. `None`: 4 MiB (where the copy engines overtook the
    /// kernels on one H200); `Some(usize::MAX)`: never. Rank 0's value is
    /// used.
    pub copy_engines_from: Option<usize>,
    /// GPU hand-off through host memory, by the copy engines: about how many
    /// bytes of each rank's segment move between two of its flags at most
    /// (at least 2 chunks a segment, at most 63 a launch; at least 16 bytes,
    /// at most 1 GiB). Smaller chunks overlap more of the copies each way
    /// and pay for more flags. `None`: 4 MiB. Rank 0's value is used.
    pub copy_chunk_bytes: Option<usize>,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            control: CommOptions::default(),
            chunk_bytes: 16 << 20,
            one_shot_read_budget: None,
            algorithm: AlgorithmChoice::Auto,
            peer_to_peer: PeerToPeer::Auto,
            peer_read: PeerRead::Direct,
            gpu_poll: Duration::from_micros(200),
            handoff: Handoff::Auto,
            handoff_window: None,
            handoff_timeout: Duration::from_secs(10),
            handoff_blocks: None,
            copy_engines_from: None,
            copy_chunk_bytes: None,
        }
    }
}

/// Which launches of the GPU hand-off through host memory the copy engines
/// move, and in what chunks (rank 0's `CudaOptions::copy_engines_from` and
/// `copy_chunk_bytes`, or their defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyEnginePlan {
    /// Two-shot launches of this many bytes and more.
    pub from_bytes: usize,
    /// About this many bytes of a rank's segment between two flags at most.
    pub chunk_bytes: usize,
}

/// Which hand-off a communicator uses (rank 0's choice holds for all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handoff {
    /// On the GPU when every rank has a GPU of its own (at most 8 ranks)
    /// and the ring is not forced: through device memory over peer-to-peer,
    /// or through pinned shared host memory without it. On the host
    /// otherwise.
    Auto = 0,
    /// Always on the GPU (ranks sharing a GPU then wait for each other's
    /// time slices unless MPS runs them together: for tests).
    Gpu = 1,
    /// Ranks meet on the host after every step (the host-mediated path).
    Host = 2,
}

impl Handoff {
    /// The choice as rank 0 broadcast it (`as i64`).
    pub(super) fn from_word(word: i64) -> Option<Handoff> {
        [Handoff::Auto, Handoff::Gpu, Handoff::Host]
            .into_iter()
            .find(|handoff| *handoff as i64 == word)
    }
}
