//! The exchange blocks of the GPU hand-off: every rank's flags, inboxes and
//! result slots, as this rank's GPU addresses them. On the peer-to-peer path
//! each rank's block is device memory, IPC-exported and opened by every
//! peer; without peer-to-peer it is the rank's backend area of the control
//! plane's shared segment, pinned and mapped into every rank's GPU.

use std::sync::Arc;

use crate::engine::cuda::error::{on_rank, CudaError};
use crate::engine::cuda::gpu::Gpu;
use crate::engine::cuda::ipc::{self, PeerMemory, HANDLE_WORDS};
use crate::engine::cuda::kernels::HANDOFF_HEADER_BYTES;
use crate::engine::cuda::memory::{DeviceBuffer, HostRegistration};
use crate::engine::{Communicator, EngineError};

/// Where the exchange blocks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExchangeMemory {
    /// Each rank's device memory, opened by the peers over CUDA IPC.
    Device,
    /// The ranks' backend areas of the control plane's shared segment,
    /// pinned and mapped into every rank's GPU.
    Host,
}

/// Every rank's exchange block as this rank's GPU addresses it.
pub(super) enum Blocks {
    Device {
        own: DeviceBuffer<u8>,
        /// `None` at our own rank.
        peers: Vec<Option<PeerMemory>>,
    },
    Host {
        areas: Vec<HostRegistration>,
    },
}

impl Blocks {
    /// Bytes of a rank's block: the flags and the calls they carry, then
    /// inboxes and result slots of `window` bytes, per sender and parity.
    pub(super) fn bytes(nranks: usize, window: usize) -> usize {
        HANDOFF_HEADER_BYTES + 4 * nranks * window
    }

    /// Sets up every rank's block of `bytes` in `memory` (collective: every
    /// rank calls it at init).
    pub(super) fn open(
        memory: ExchangeMemory,
        gpu: &Arc<Gpu>,
        control: &mut Communicator,
        bytes: usize,
    ) -> Result<Blocks, EngineError> {
        match memory {
            ExchangeMemory::Device => Blocks::open_device(gpu, control, bytes),
            ExchangeMemory::Host => Blocks::open_host(gpu, control, bytes),
        }
    }

    /// Allocates this rank's block in device memory, exports it, and opens
    /// every peer's.
    fn open_device(
        gpu: &Arc<Gpu>,
        control: &mut Communicator,
        bytes: usize,
    ) -> Result<Blocks, EngineError> {
        let (rank, nranks) = (control.rank(), control.nranks());
        let err = on_rank(rank);
        let own = DeviceBuffer::<u8>::zeroed(gpu, bytes).map_err(&err)?;
        let handle = ipc::export(gpu, own.address()).map_err(&err)?;
        let mut handles = vec![0i64; HANDLE_WORDS * nranks];
        control.all_gather(&handle, &mut handles)?;
        // The kernels write flags and data anywhere in a peer's `bytes`: a
        // block too small for that fails here, the error naming its rank.
        let peers = (0..nranks)
            .map(|peer| {
                (peer != rank)
                    .then(|| PeerMemory::open(gpu, peer, ipc::handle_of(&handles, peer), bytes))
                    .transpose()
            })
            .collect::<Result<_, CudaError>>()
            .map_err(&err)?;
        Ok(Blocks::Device { own, peers })
    }

    /// Pins every rank's backend area of the control plane's segment (fresh
    /// memfd pages: zeroed) and maps it into this GPU.
    fn open_host(
        gpu: &Arc<Gpu>,
        control: &mut Communicator,
        bytes: usize,
    ) -> Result<Blocks, EngineError> {
        let err = on_rank(control.rank());
        let mut areas = Vec::with_capacity(control.nranks());
        for owner in 0..control.nranks() {
            let (start, length) = control
                .backend_area(owner)
                .filter(|(_, length)| *length >= bytes)
                .ok_or_else(|| err(CudaError::NoHostExchange { bytes }))?;
            // SAFETY: the area is `length` bytes of the control plane's
            // mapping, which lives as long as the communicator; the hand-off
            // (and this registration) is dropped before the control plane
            // (field order of `CudaCommunicator`).
            areas.push(unsafe { HostRegistration::new(gpu, start, length) }.map_err(&err)?);
        }
        Ok(Blocks::Host { areas })
    }

    /// `rank`'s block as mapped here.
    pub(super) fn address(&self, rank: usize) -> u64 {
        match self {
            Blocks::Device { own, peers } => peers[rank]
                .as_ref()
                .map_or_else(|| own.address(), PeerMemory::address),
            Blocks::Host { areas } => areas[rank].device_address(),
        }
    }

    /// `sender`'s inbox of parity 0 in `at`'s block, as mapped here (the
    /// kernels' `inbox`: the flags and their calls, then the slots).
    pub(super) fn inbox(&self, at: usize, sender: usize, window: usize) -> u64 {
        self.address(at) + (HANDOFF_HEADER_BYTES + sender * window) as u64
    }

    /// `owner`'s result slot of parity 0 in `at`'s block, as mapped here
    /// (the kernels' `results`: after both parities' inboxes).
    pub(super) fn results(&self, at: usize, owner: usize, nranks: usize, window: usize) -> u64 {
        self.address(at) + (HANDOFF_HEADER_BYTES + (2 * nranks + owner) * window) as u64
    }

    pub(super) fn count(&self) -> usize {
        match self {
            Blocks::Device { peers, .. } => peers.len(),
            Blocks::Host { areas } => areas.len(),
        }
    }
}
