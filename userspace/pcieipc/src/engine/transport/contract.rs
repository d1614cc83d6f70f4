//! The small types the engine and the transports speak in: windows,
//! counters, window sizes and capabilities.

/// What a transport lets the engine do beyond windows and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Ranks may read each other's process memory (`read_peer`), so finished
    /// chunks can be read where they lie (the single-copy all-gather, the
    /// direct all_reduce). Still probed at init: the host may forbid it.
    pub peer_reads: bool,
    /// The transport follows the link under its device and reports changes
    /// (`device_link`, `poll_link`).
    pub link_events: bool,
    /// The windows live in device memory (a BAR), not host memory.
    pub device_memory: bool,
}

/// A window its owner writes and its peers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// A slot of the stream of first ring steps (the rank's raw input), which
    /// may run ahead of the rest: see docs/engine.md.
    Raw { slot: usize },
    /// A slot of the stream of all later ring steps and of broadcast.
    Relay { slot: usize },
    /// One of the two one-shot buffers, alternated between calls so a rank can
    /// publish the next call while a slow peer still reads the previous one.
    OneShot { parity: usize },
    /// The rank's backend area (`WindowSizes::backend_bytes`).
    Backend,
}

/// A counter published in shared memory. `*Posted` counts messages its owner has
/// written to its windows; `*Consumed` counts those its successor has finished
/// reading (written by the successor into the owner's block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    RawPosted = 0,
    RawConsumed = 1,
    RelayPosted = 2,
    RelayConsumed = 3,
    OneShotPosted = 4,
    /// Calls rank 0 has published (only rank 0's counts): its descriptor
    /// carries each ring call's chunk size, which the other ranks adopt.
    CallsPublished = 5,
    /// The single-copy probe at init (shm): 1 once this rank has published
    /// its probe word, then 2 if it read its predecessor's back with
    /// `process_vm_readv`, 3 if it could not or would not.
    Probed = 6,
    /// Chunk checksums: the message of this rank's streams its successor
    /// wants written again (stream in bit 31: 0 Raw, 1 Relay; the low 31 bits
    /// of the message's number), written by the successor before it counts
    /// the request in `ResendRequests`.
    ResendWanted = 7,
    /// Resends the successor has asked this rank for (written by the successor).
    ResendRequests = 8,
    /// Resends this rank has made (its own).
    Resent = 9,
}

impl Signal {
    /// The counter's name, as its variant reads (for traces).
    pub fn name(self) -> &'static str {
        match self {
            Signal::RawPosted => "RawPosted",
            Signal::RawConsumed => "RawConsumed",
            Signal::RelayPosted => "RelayPosted",
            Signal::RelayConsumed => "RelayConsumed",
            Signal::OneShotPosted => "OneShotPosted",
            Signal::CallsPublished => "CallsPublished",
            Signal::Probed => "Probed",
            Signal::ResendWanted => "ResendWanted",
            Signal::ResendRequests => "ResendRequests",
            Signal::Resent => "Resent",
        }
    }
}

pub(crate) const SIGNALS: [Signal; 10] = [
    Signal::RawPosted,
    Signal::RawConsumed,
    Signal::RelayPosted,
    Signal::RelayConsumed,
    Signal::OneShotPosted,
    Signal::CallsPublished,
    Signal::Probed,
    Signal::ResendWanted,
    Signal::ResendRequests,
    Signal::Resent,
];

/// The window sizes all ranks agreed on at the rendezvous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSizes {
    /// Bytes in one Raw or Relay slot: the largest chunk.
    pub slot_bytes: usize,
    pub raw_slots: usize,
    pub relay_slots: usize,
    /// Bytes in each of the two one-shot buffers.
    pub one_shot_bytes: usize,
    /// Bytes of each rank's backend area (0: none): memory the engine never
    /// touches, for a backend layered on the communicator whose devices read
    /// and write the segment themselves (the CUDA hand-off through host
    /// memory registers it with the GPU).
    pub backend_bytes: usize,
}
