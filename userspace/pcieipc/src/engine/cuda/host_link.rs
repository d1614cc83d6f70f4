//! A GPU's link to host memory as its copy engines measure it: the limit
//! every path through host memory is held to (issue 40's "link
//! utilisation"), and what an all_reduce moves across it.
//!
//! The rate is measured, not read from the link's speed and width: what a
//! Gen5 x16 link carries after its protocol overhead, what the root complex
//! and the host's memory accept, and whether both directions run at full
//! rate at once differ from machine to machine (on the H200 machine the copy
//! engines move 55 GB/s each way alone and 50 both ways at once). Every
//! all_reduce through host memory moves as many bytes to the GPU as from it,
//! so its limit per direction is the slower direction's rate with both busy.

use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::error::{on_rank, CudaError};
use super::gpu::Gpu;
use super::memory::{DeviceBuffer, PinnedHost};
use super::options::DataPath;
use crate::engine::{Algorithm, Communicator, EngineError, ReduceOp};

/// Bytes of each timed copy: large enough that a copy's launch and the
/// events' 0.5 µs resolution are far below a thousandth of it.
pub const MEASURED_COPY_BYTES: usize = 64 << 20;
/// Copies per direction in each measurement; the first of each direction is
/// made before, untimed (the pages' first mapping into the GPU).
pub const MEASURED_COPIES: u32 = 8;

/// A GPU's copy rates between its memory and pinned host memory, GB/s
/// (10^9 bytes a second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLinkRate {
    /// Host to GPU, alone.
    pub to_gpu_gb_s: f64,
    /// GPU to host, alone.
    pub from_gpu_gb_s: f64,
    /// Host to GPU while GPU to host runs too.
    pub both_to_gpu_gb_s: f64,
    /// GPU to host while host to GPU runs too.
    pub both_from_gpu_gb_s: f64,
}

impl HostLinkRate {
    /// What a call moving as many bytes each way can reach per direction:
    /// the slower direction with both busy.
    pub fn limit_gb_s(&self) -> f64 {
        self.both_to_gpu_gb_s.min(self.both_from_gpu_gb_s)
    }

    /// The rates as four numbers, to exchange between ranks.
    pub(crate) fn to_words(self) -> [f64; 4] {
        [
            self.to_gpu_gb_s,
            self.from_gpu_gb_s,
            self.both_to_gpu_gb_s,
            self.both_from_gpu_gb_s,
        ]
    }

    pub(crate) fn from_words(words: [f64; 4]) -> HostLinkRate {
        let [to_gpu_gb_s, from_gpu_gb_s, both_to_gpu_gb_s, both_from_gpu_gb_s] = words;
        HostLinkRate {
            to_gpu_gb_s,
            from_gpu_gb_s,
            both_to_gpu_gb_s,
            both_from_gpu_gb_s,
        }
    }
}

/// One GPU of a job and its link's measured rates.
#[derive(Clone, Debug, PartialEq)]
pub struct HostLink {
    /// The GPU's ordinal in its lowest rank's process.
    pub ordinal: usize,
    /// Its PCI address, `domain:bus:device` (function 0).
    pub pci_address: String,
    /// The ranks whose calls cross this link, in order.
    pub ranks: Vec<usize>,
    pub rate: HostLinkRate,
}

/// Every GPU link of a job through host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostLinks {
    pub links: Vec<HostLink>,
}

impl HostLinks {
    /// The share of its limit the busiest link carried in a call of
    /// `seconds` that moved `bytes_per_rank` each way across every rank's
    /// link (`CudaCommunicator::host_link_bytes`): ranks sharing a GPU share
    /// its link, so their bytes add up.
    pub fn utilisation(&self, bytes_per_rank: u64, seconds: f64) -> f64 {
        self.links
            .iter()
            .map(|link| {
                let bytes = bytes_per_rank as f64 * link.ranks.len() as f64;
                bytes / seconds / 1e9 / link.rate.limit_gb_s()
            })
            .fold(0.0, f64::max)
    }
}

/// Bytes an all_reduce of `bytes` moves each way across one rank's link to
/// host memory, on `path` with `algorithm` among `nranks` ranks; `None` on
/// the peer-to-peer path, which does not cross to the host.
///
/// - Host-staged: the input down to the host, the result back up.
/// - Through pinned shared host memory, one-shot: the input into every
///   peer's inbox (N − 1 copies down), every peer's input read from the own
///   inbox (N − 1 up).
/// - The same, two-shot (direct): each peer's segment down to it and the
///   peers' segments up from the own inbox, then the own reduced segment
///   down to every peer and theirs up: 2(N − 1)/N of the message each way.
pub(crate) fn all_reduce_bytes_per_direction(
    path: &DataPath,
    algorithm: Algorithm,
    nranks: usize,
    bytes: usize,
) -> Option<u64> {
    let (bytes, peers) = (bytes as u64, nranks.saturating_sub(1) as u64);
    match (path, algorithm) {
        (DataPath::PeerToPeer, _) => None,
        (DataPath::HostStaged { .. }, _) => Some(if nranks > 1 { bytes } else { 0 }),
        (DataPath::HostMapped { .. }, Algorithm::OneShot) => Some(peers * bytes),
        (DataPath::HostMapped { .. }, Algorithm::Direct | Algorithm::Ring) => {
            Some((2 * peers * bytes).div_ceil(nranks.max(1) as u64))
        }
    }
}

/// Measures the link to host memory of every GPU of the job, one GPU at a
/// time (the lowest rank on it measures while the others wait, so that no
/// other traffic shares the link or the host's memory meanwhile), and gives
/// every rank the whole list. Collective: every rank calls it, with the
/// control plane `control` of the communicator whose GPU is `gpu`.
pub(super) fn measure_job(
    gpu: &Arc<Gpu>,
    control: &mut Communicator,
) -> Result<HostLinks, EngineError> {
    let (rank, nranks) = (control.rank(), control.nranks());
    let err = on_rank(rank);
    let mut addresses = vec![0i64; nranks];
    control.all_gather(&[gpu.pci_address().map_err(&err)?], &mut addresses)?;
    let mut ordinals = vec![0i64; nranks];
    control.all_gather(&[gpu.ordinal() as i64], &mut ordinals)?;
    // Each GPU once, at its lowest rank, in rank order.
    let measurers: Vec<usize> = (0..nranks)
        .filter(|&r| !addresses[..r].contains(&addresses[r]))
        .collect();
    let mut own = [0.0f64; 4];
    for &measurer in &measurers {
        // A rank that failed still reaches the barrier, so that no rank
        // waits for it to its timeout; the failure is its to return.
        let measured = (measurer == rank).then(|| measure(gpu));
        control.all_reduce_in_place(&mut [0u8], ReduceOp::Max)?;
        if let Some(measured) = measured {
            own = measured.map_err(&err)?.to_words();
        }
    }
    let mut words = vec![0.0f64; 4 * nranks];
    control.all_gather(&own, &mut words)?;
    let links = measurers
        .iter()
        .map(|&measurer| {
            let address = addresses[measurer];
            let rate: [f64; 4] = words[4 * measurer..4 * measurer + 4]
                .try_into()
                .expect("four words a rank");
            HostLink {
                ordinal: ordinals[measurer] as usize,
                pci_address: pci_address_name(address),
                ranks: (0..nranks).filter(|&r| addresses[r] == address).collect(),
                rate: HostLinkRate::from_words(rate),
            }
        })
        .collect();
    Ok(HostLinks { links })
}

/// `Gpu::pci_address`'s number as `domain:bus:device.0`.
fn pci_address_name(address: i64) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.0",
        (address >> 16) & 0xffff,
        (address >> 8) & 0xff,
        address & 0xff
    )
}

/// Measures `gpu`'s link to host memory with its copy engines: each
/// direction alone, then both at once, `MEASURED_COPIES` copies of
/// `MEASURED_COPY_BYTES` per direction, on two streams of its own, timed by
/// events on the GPU. Takes about 0.1 s on a Gen5 x16 link, and the
/// link's whole capacity meanwhile: measure one GPU at a time, with nothing
/// else on it.
fn measure(gpu: &Arc<Gpu>) -> Result<HostLinkRate, CudaError> {
    let bytes = MEASURED_COPY_BYTES;
    gpu.bind()?;
    let host_source = PinnedHost::new(gpu, bytes)?;
    let host_target = PinnedHost::new(gpu, bytes)?;
    let device_source = DeviceBuffer::<u8>::zeroed(gpu, bytes)?;
    let device_target = DeviceBuffer::<u8>::zeroed(gpu, bytes)?;
    let to_gpu_stream = gpu.new_stream()?;
    let from_gpu_stream = gpu.new_stream()?;
    let copies = Copies {
        gpu,
        to_gpu: (&host_source, device_target.address()),
        from_gpu: (device_source.address(), &host_target),
        to_gpu_stream: &to_gpu_stream,
        from_gpu_stream: &from_gpu_stream,
    };
    // Untimed: the first copy of each direction maps the pages.
    copies.queue(1, true, true)?;
    gpu.synchronize()?;
    let to_gpu_gb_s = copies.timed(true, false)?.0;
    let from_gpu_gb_s = copies.timed(false, true)?.1;
    let (both_to_gpu_gb_s, both_from_gpu_gb_s) = copies.timed(true, true)?;
    Ok(HostLinkRate {
        to_gpu_gb_s,
        from_gpu_gb_s,
        both_to_gpu_gb_s,
        both_from_gpu_gb_s,
    })
}

/// The copies a measurement queues: pinned host memory to device memory on
/// one stream, device memory to pinned host memory on the other.
struct Copies<'a> {
    gpu: &'a Gpu,
    to_gpu: (&'a PinnedHost, u64),
    from_gpu: (u64, &'a PinnedHost),
    to_gpu_stream: &'a Arc<CudaStream>,
    from_gpu_stream: &'a Arc<CudaStream>,
}

impl Copies<'_> {
    /// Queues `count` copies in each direction asked for.
    fn queue(&self, count: u32, to_gpu: bool, from_gpu: bool) -> Result<(), CudaError> {
        for _ in 0..count {
            if to_gpu {
                let (host, device) = self.to_gpu;
                // SAFETY: `device` starts an allocation of `host.len()` bytes
                // and `host` is pinned memory of as many; both outlive the
                // measurement, which waits for the copies before dropping
                // them, and nothing else touches them meanwhile.
                unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        device,
                        host.as_ptr().cast(),
                        host.len(),
                        self.to_gpu_stream.cu_stream(),
                    )
                }
                .result()
                .map_err(self.gpu.driver("copying to the GPU"))?;
            }
            if from_gpu {
                let (device, host) = self.from_gpu;
                // SAFETY: as above, in the other direction; nothing reads
                // `host` (what lands there is never looked at).
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(
                        host.as_ptr().cast(),
                        device,
                        host.len(),
                        self.from_gpu_stream.cu_stream(),
                    )
                }
                .result()
                .map_err(self.gpu.driver("copying from the GPU"))?;
            }
        }
        Ok(())
    }

    /// Times `MEASURED_COPIES` copies in each direction asked for, both
    /// directions starting together: each direction's rate, GB/s (0 for a
    /// direction not asked for).
    fn timed(&self, to_gpu: bool, from_gpu: bool) -> Result<(f64, f64), CudaError> {
        let gpu = self.gpu;
        let event = || gpu.new_timing_event();
        let (start, to_gpu_end, from_gpu_end) = (event()?, event()?, event()?);
        let record = |event: &CudaEvent, stream: &Arc<CudaStream>| {
            event
                .record(stream)
                .map_err(gpu.driver("recording a timing event"))
        };
        record(&start, self.to_gpu_stream)?;
        self.from_gpu_stream
            .wait(&start)
            .map_err(gpu.driver("ordering the copy streams"))?;
        self.queue(MEASURED_COPIES, to_gpu, from_gpu)?;
        record(&to_gpu_end, self.to_gpu_stream)?;
        record(&from_gpu_end, self.from_gpu_stream)?;
        gpu.synchronize()?;
        let moved = MEASURED_COPY_BYTES as f64 * f64::from(MEASURED_COPIES);
        let rate = |end: &CudaEvent, asked: bool| -> Result<f64, CudaError> {
            if !asked {
                return Ok(0.0);
            }
            let ms = start
                .elapsed_ms(end)
                .map_err(gpu.driver("reading a timing event"))?;
            Ok(moved / (f64::from(ms) / 1e3) / 1e9)
        };
        Ok((rate(&to_gpu_end, to_gpu)?, rate(&from_gpu_end, from_gpu)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through_host() -> DataPath {
        DataPath::HostMapped {
            reason: "asked".to_owned(),
        }
    }

    fn staged() -> DataPath {
        DataPath::HostStaged {
            reason: "asked".to_owned(),
        }
    }

    #[test]
    fn an_all_reduce_moves_as_the_kernels_and_the_staging_copy() {
        let bytes = 3 << 20;
        let per_direction = |path: &DataPath, algorithm, nranks| {
            all_reduce_bytes_per_direction(path, algorithm, nranks, bytes)
        };
        // One-shot: the input to each of the N - 1 peers, theirs back.
        for nranks in 1..=8u64 {
            assert_eq!(
                per_direction(&through_host(), Algorithm::OneShot, nranks as usize),
                Some((nranks - 1) * bytes as u64)
            );
        }
        // Two-shot: 2(N - 1)/N of the message each way.
        assert_eq!(
            per_direction(&through_host(), Algorithm::Direct, 2),
            Some(bytes as u64)
        );
        assert_eq!(
            per_direction(&through_host(), Algorithm::Direct, 4),
            Some(3 * bytes as u64 / 2)
        );
        assert_eq!(
            per_direction(&through_host(), Algorithm::Direct, 1),
            Some(0)
        );
        // Staged: down once and up once, whatever the host's algorithm.
        for algorithm in [Algorithm::Ring, Algorithm::OneShot, Algorithm::Direct] {
            assert_eq!(per_direction(&staged(), algorithm, 4), Some(bytes as u64));
            assert_eq!(per_direction(&staged(), algorithm, 1), Some(0));
            assert_eq!(per_direction(&DataPath::PeerToPeer, algorithm, 4), None);
        }
        // Rounded up, never down, where N does not divide it.
        assert_eq!(
            all_reduce_bytes_per_direction(&through_host(), Algorithm::Direct, 3, 10),
            Some(14)
        );
    }

    fn rate(both_to_gpu_gb_s: f64, both_from_gpu_gb_s: f64) -> HostLinkRate {
        HostLinkRate {
            to_gpu_gb_s: 55.0,
            from_gpu_gb_s: 55.0,
            both_to_gpu_gb_s,
            both_from_gpu_gb_s,
        }
    }

    #[test]
    fn the_limit_is_the_slower_direction_with_both_busy() {
        assert_eq!(rate(50.0, 48.0).limit_gb_s(), 48.0);
        assert_eq!(rate(41.0, 48.0).limit_gb_s(), 41.0);
        let words = rate(50.5, 49.25).to_words();
        assert_eq!(HostLinkRate::from_words(words), rate(50.5, 49.25));
    }

    #[test]
    fn ranks_sharing_a_link_add_up_and_the_busiest_link_counts() {
        let link = |ranks: Vec<usize>, limit| HostLink {
            ordinal: 0,
            pci_address: "0000:18:00.0".to_owned(),
            ranks,
            rate: rate(limit, limit),
        };
        // Two ranks on one GPU, 1 GB each way each in 0.1 s: 20 GB/s of 50.
        let shared = HostLinks {
            links: vec![link(vec![0, 1], 50.0)],
        };
        assert!((shared.utilisation(1_000_000_000, 0.1) - 0.4).abs() < 1e-12);
        // A GPU each: the slower link (25 GB/s) is the busier.
        let apart = HostLinks {
            links: vec![link(vec![0], 50.0), link(vec![1], 25.0)],
        };
        assert!((apart.utilisation(1_000_000_000, 0.1) - 0.4).abs() < 1e-12);
        assert_eq!(HostLinks { links: vec![] }.utilisation(1, 1.0), 0.0);
    }

    #[test]
    fn pci_addresses_read_as_lspci_writes_them() {
        assert_eq!(pci_address_name(0x0000_1800), "0000:18:00.0");
        assert_eq!(
            pci_address_name((0x0001 << 16) | (0xc3 << 8) | 0x1f),
            "0001:c3:1f.0"
        );
    }
}
