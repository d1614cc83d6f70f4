//! What `pcieipc bench` measures, over either kind of communicator: the host
//! one (shm or pcieipc transport, buffers in host memory) or the CUDA one
//! (buffers in GPU memory). Timing, checking and the table are shared.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pcieipc::engine::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use pcieipc::engine::cuda::cudarc::driver::CudaGraph;
use pcieipc::engine::cuda::{
    CudaCommunicator, DataPath, DeviceBuffer, GpuCall, HostLinks, PeerRead, StreamGate,
};
use pcieipc::engine::{Algorithm, CallDescriptor, Communicator, Element, ReduceOp};

pub trait Collective {
    /// A buffer of `T` where this communicator reduces.
    type Buffer<T: Element + Default>;

    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    /// The host communicator, for the benchmark's own small exchanges
    /// (error counts, times) that must not be timed on the device path.
    fn host(&mut self) -> &mut Communicator;
    /// The transport and its parameters, for the table's header.
    fn describe(&self) -> String;
    fn transport_name(&self) -> &'static str;
    /// How chunks are sized when --chunk-bytes does not say, for the header.
    fn default_chunks(&self) -> String;
    /// The last call as this rank made it (its chunk size included).
    fn last_call(&self) -> Option<CallDescriptor>;
    fn algorithm_for<T: Element>(&self, count: usize) -> Algorithm;
    /// The job's GPU links to host memory, measured (collective), where its
    /// calls cross them: `--transport cuda` through host memory.
    fn host_links(&mut self) -> anyhow::Result<Option<HostLinks>> {
        Ok(None)
    }
    /// The bytes an all_reduce of `count` elements moves each way across
    /// this rank's link to host memory, where its calls cross one.
    fn host_link_bytes<T: Element>(&self, _count: usize) -> Option<u64> {
        None
    }

    fn upload<T: Element + Default>(&mut self, host: &[T]) -> anyhow::Result<Self::Buffer<T>>;
    fn download<T: Element + Default>(
        &mut self,
        buffer: &Self::Buffer<T>,
    ) -> anyhow::Result<Vec<T>>;
    fn all_reduce<T: Element + Default>(
        &mut self,
        input: &Self::Buffer<T>,
        output: &mut Self::Buffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()>;
    fn all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut Self::Buffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()>;
    /// Starts an all_reduce that `wait_queued` ends: queued on a stream where
    /// the communicator can queue calls, else done before it returns.
    fn queue_all_reduce<T: Element + Default>(
        &mut self,
        input: &Self::Buffer<T>,
        output: &mut Self::Buffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        self.all_reduce(input, output, op)
    }
    fn queue_all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut Self::Buffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        self.all_reduce_in_place(buffer, op)
    }
    /// Waits for every queued call.
    fn wait_queued(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Starts capturing the calls queued from now on into a CUDA graph.
    fn begin_graph(&mut self) -> anyhow::Result<()> {
        bail!("--graph needs calls queued on a GPU stream: --transport cuda with the GPU hand-off")
    }
    /// Ends the capture `begin_graph` started.
    fn end_graph(&mut self) -> anyhow::Result<CudaGraph> {
        bail!("--graph needs calls queued on a GPU stream")
    }
    /// A clock for `calls` back-to-back calls: the host's, where a call
    /// returns done.
    fn call_clock(&mut self, calls: usize) -> anyhow::Result<CallClock> {
        Ok(CallClock::host(calls))
    }
    /// The ends the calls under a GPU clock stamped on the GPU (ns), once
    /// they have run.
    fn call_ends_ns(&mut self) -> anyhow::Result<Vec<u64>> {
        bail!("calls' ends are stamped only where calls are queued on a GPU stream")
    }
}

impl Collective for Communicator {
    type Buffer<T: Element + Default> = Vec<T>;

    fn rank(&self) -> usize {
        Communicator::rank(self)
    }

    fn nranks(&self) -> usize {
        Communicator::nranks(self)
    }

    fn host(&mut self) -> &mut Communicator {
        self
    }

    fn describe(&self) -> String {
        let name = self.transport_name();
        let peer_reads = self.transport_capabilities().peer_reads;
        let streaming = match self.streaming_stores_from() {
            Some(bytes) => format!(
                ", non-temporal slot fills from a {} working set{}",
                size_name(bytes),
                if self.slot_fill_measured() {
                    ", below it as the calls measure"
                } else {
                    ""
                }
            ),
            None => String::new(),
        };
        let moves = match (peer_reads, self.single_copy()) {
            (true, true) => {
                let sizes = |messages: std::ops::RangeInclusive<usize>| {
                    format!(
                        "{} to {}",
                        size_name(*messages.start()),
                        size_name(*messages.end())
                    )
                };
                let direct = self.direct_messages();
                let direct = if direct.is_empty() {
                    "the direct all_reduce when asked (--algorithm direct)".to_owned()
                } else {
                    format!("direct all_reduce for {} messages", sizes(direct))
                };
                format!(
                    "transport {name}, single-copy reads (peers' memory): {direct}, ring \
                     all-gather single-copy for {}",
                    sizes(self.single_copy_messages())
                )
            }
            (true, false) => {
                format!("transport {name}, all-gather through relay slots (two copies)")
            }
            _ => format!("transport {name}"),
        };
        moves + &streaming
    }

    fn transport_name(&self) -> &'static str {
        Communicator::transport_name(self)
    }

    fn default_chunks(&self) -> String {
        "by link and size".to_owned()
    }

    fn last_call(&self) -> Option<CallDescriptor> {
        Communicator::last_call(self)
    }

    fn algorithm_for<T: Element>(&self, count: usize) -> Algorithm {
        Communicator::algorithm_for::<T>(self, count)
    }

    fn upload<T: Element + Default>(&mut self, host: &[T]) -> anyhow::Result<Vec<T>> {
        Ok(host.to_vec())
    }

    fn download<T: Element + Default>(&mut self, buffer: &Vec<T>) -> anyhow::Result<Vec<T>> {
        Ok(buffer.clone())
    }

    fn all_reduce<T: Element + Default>(
        &mut self,
        input: &Vec<T>,
        output: &mut Vec<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        Ok(Communicator::all_reduce(self, input, output, op)?)
    }

    fn all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut Vec<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        Ok(Communicator::all_reduce_in_place(self, buffer, op)?)
    }
}

impl Collective for CudaCommunicator {
    type Buffer<T: Element + Default> = DeviceBuffer<T>;

    fn rank(&self) -> usize {
        CudaCommunicator::rank(self)
    }

    fn nranks(&self) -> usize {
        CudaCommunicator::nranks(self)
    }

    fn host(&mut self) -> &mut Communicator {
        self.control()
    }

    fn describe(&self) -> String {
        let path = match self.data_path() {
            DataPath::PeerToPeer => match self.peer_read() {
                PeerRead::Direct => "peer-to-peer, direct reads".to_owned(),
                PeerRead::CopyEngine => "peer-to-peer, copy-engine reads".to_owned(),
            },
            DataPath::HostMapped { reason } => match self.copy_engine_plan() {
                Some(plan) => format!(
                    "through pinned shared host memory ({reason}), by the copy engines from {} B \
                     in chunks of {} B",
                    plan.from_bytes, plan.chunk_bytes
                ),
                None => format!("through pinned shared host memory ({reason})"),
            },
            DataPath::HostStaged { reason } => format!("host-staged ({reason})"),
        };
        let handoff = match self.handoff_blocks() {
            Some(blocks) => {
                format!("hand-off on the GPU (calls queued on a stream, up to {blocks} blocks a launch)")
            }
            None => "hand-off on the host after every step".to_owned(),
        };
        format!(
            "transport cuda, GPU {}, {path}, {handoff}, context {:.1} ms (not in init)",
            self.gpu().ordinal(),
            self.gpu().context_time().as_secs_f64() * 1e3
        )
    }

    fn transport_name(&self) -> &'static str {
        "cuda"
    }

    fn default_chunks(&self) -> String {
        format!("{} B", self.chunk_bytes())
    }

    fn last_call(&self) -> Option<CallDescriptor> {
        CudaCommunicator::last_call(self)
    }

    fn algorithm_for<T: Element>(&self, count: usize) -> Algorithm {
        CudaCommunicator::algorithm_for::<T>(self, count)
    }

    fn host_links(&mut self) -> anyhow::Result<Option<HostLinks>> {
        self.measure_host_links()
            .context("measuring the GPUs' links to host memory")
    }

    fn host_link_bytes<T: Element>(&self, count: usize) -> Option<u64> {
        CudaCommunicator::host_link_bytes::<T>(self, count)
    }

    fn upload<T: Element + Default>(&mut self, host: &[T]) -> anyhow::Result<DeviceBuffer<T>> {
        DeviceBuffer::from_host(self.gpu(), host).context("uploading the benchmark's input")
    }

    fn download<T: Element + Default>(
        &mut self,
        buffer: &DeviceBuffer<T>,
    ) -> anyhow::Result<Vec<T>> {
        buffer.to_host().context("downloading the result")
    }

    fn all_reduce<T: Element + Default>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        Ok(self.run(GpuCall::all_reduce(input, output, op))?)
    }

    fn all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        Ok(self.run(GpuCall::all_reduce_in_place(buffer, op))?)
    }

    // On the host hand-off `queue` returns with the call done.
    fn queue_all_reduce<T: Element + Default>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        Ok(self.queue(GpuCall::all_reduce(input, output, op))?)
    }

    fn queue_all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> anyhow::Result<()> {
        Ok(self.queue(GpuCall::all_reduce_in_place(buffer, op))?)
    }

    fn wait_queued(&mut self) -> anyhow::Result<()> {
        Ok(self.wait_for_gpu()?)
    }

    fn begin_graph(&mut self) -> anyhow::Result<()> {
        if !self.hands_off_on_gpu() {
            bail!("--graph needs the GPU hand-off (--handoff gpu, or a GPU per rank)");
        }
        self.gpu()
            .stream_handle()
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .context("starting a CUDA graph capture")
    }

    /// On the GPU hand-off calls are queued back to back, and the host's
    /// clock would time their queuing: each call stamps its end on the GPU
    /// (`CudaCommunicator::stamp_call_ends`), `calls` timed calls and the
    /// lead-in before them. The stream is held behind a gate until the
    /// first calls are queued, so that a host slower to queue a call than
    /// the GPU is to run it (a preempted thread, a slow launch) shows in no
    /// call's time.
    fn call_clock(&mut self, calls: usize) -> anyhow::Result<CallClock> {
        if !self.hands_off_on_gpu() {
            return Ok(CallClock::host(calls));
        }
        self.stamp_call_ends(calls + 1)
            .context("asking the calls to stamp their ends on the GPU")?;
        let gate = StreamGate::hold(self.gpu(), &self.gpu().stream_handle(), GATE_HELD_AT_MOST)
            .context("holding the stream until the timed calls are queued")?;
        Ok(CallClock::Gpu {
            gate,
            opened: false,
        })
    }

    fn call_ends_ns(&mut self) -> anyhow::Result<Vec<u64>> {
        CudaCommunicator::call_ends_ns(self).context("reading the calls' ends on the GPU")
    }

    fn end_graph(&mut self) -> anyhow::Result<CudaGraph> {
        self.gpu()
            .stream_handle()
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .context("ending the CUDA graph capture")?
            .context("the capture recorded no graph")
    }
}

/// How many calls the GPU clock's stream has queued behind its gate when it
/// opens: at 8 bytes (about 7 µs a call on an H100 under MPS, a few to queue
/// on the host) a head start of 0.9 ms.
pub const QUEUED_AHEAD: usize = 128;

/// The longest the GPU clock's gate holds its stream: a host that blocks
/// queuing behind it (a launch queue full of large calls' steps) has it
/// opened after this.
const GATE_HELD_AT_MOST: Duration = Duration::from_millis(100);

/// The points between back-to-back calls, from which each call's time is
/// read: the host's clock where calls return done; where they are queued on
/// the GPU's stream, the ends the calls stamp there themselves (the
/// communicator's `call_ends_ns`), the stream held by `gate` until
/// [`CallClock::open`].
pub enum CallClock {
    Host {
        stamps: Vec<Instant>,
        marked: usize,
    },
    Gpu {
        gate: StreamGate,
        /// Whether `open` has run: every rank opens at the same call, even
        /// where a gate's backstop opened it first.
        opened: bool,
    },
}

impl CallClock {
    /// The host's clock for `calls` calls. Its stamps are written here, not
    /// first by the calls' marks: a page of them faulted in by a mark (one
    /// in 256 calls) cost that call a microsecond or more. It marks once
    /// here too, and forgets the mark: the timed loop's first mark otherwise
    /// ran `mark`'s code for the first time, where a page of the binary
    /// faulted in before the first stamp took the loop's time (on the EPYC,
    /// one 8-byte loop of 50 calls in five, 5–6 µs) outside every call's.
    fn host(calls: usize) -> CallClock {
        let mut clock = CallClock::Host {
            stamps: vec![Instant::now(); calls + 1],
            marked: 0,
        };
        if clock.mark().is_ok() {
            if let CallClock::Host { marked, .. } = &mut clock {
                *marked = 0;
            }
        }
        clock
    }

    /// Marks the point after the calls so far (and before the next): on the
    /// host; on the GPU each call stamps its own end.
    pub fn mark(&mut self) -> anyhow::Result<()> {
        if let CallClock::Host { stamps, marked } = self {
            *stamps
                .get_mut(*marked)
                .context("more marks than the clock has stamps")? = Instant::now();
            *marked += 1;
        }
        Ok(())
    }

    /// Whether calls are timed on the GPU (queued, not returned done).
    pub fn is_gpu(&self) -> bool {
        matches!(self, CallClock::Gpu { .. })
    }

    /// Whether the calls queued so far wait for [`open`](Self::open).
    pub fn is_held(&self) -> bool {
        matches!(self, CallClock::Gpu { opened: false, .. })
    }

    /// Lets the calls queued so far run (the gate is freed with the clock,
    /// once they have).
    pub fn open(&mut self) {
        if let CallClock::Gpu { gate, opened, .. } = self {
            gate.open();
            *opened = true;
        }
    }

    /// Each call's time in microseconds, once the calls have run: on the
    /// host this rank's, between consecutive marks of its clock; on the GPU
    /// the job's, every rank's the same (collective): between the job's
    /// ends of successive calls, a call's end its last rank's. Each rank's
    /// ends count from its own lead-in's, which the ranks end together
    /// (they hand over), as GPUs' clocks need not agree. The slowest rank's
    /// gap for each call would not do: where the ranks' ends of a call
    /// take turns being late (through host memory, by up to a microsecond),
    /// it counts every late end and no early one (H100, 2 ranks under MPS,
    /// through host memory: 8 B calls 5–6% longer on average, 256 KiB
    /// 12–14%).
    pub fn calls_us<C: Collective>(&self, comm: &mut C) -> anyhow::Result<Vec<f64>> {
        match self {
            CallClock::Host { stamps, marked } => Ok(stamps[..*marked]
                .windows(2)
                .map(|pair| (pair[1] - pair[0]).as_secs_f64() * 1e6)
                .collect()),
            CallClock::Gpu { .. } => {
                let mut ends_us = ends_since_lead_in_us(&comm.call_ends_ns()?)?;
                comm.host()
                    .all_reduce_in_place(&mut ends_us, ReduceOp::Max)?;
                Ok(gaps_us(&ends_us))
            }
        }
    }
}

/// Each timed call's end (µs) after the lead-in's, from the ends the calls
/// stamped on the GPU (ns), the lead-in's first; a call that stamped none,
/// or ended before the one before it, is an error, not a time.
fn ends_since_lead_in_us(ends_ns: &[u64]) -> anyhow::Result<Vec<f64>> {
    if let Some(call) = ends_ns.iter().position(|&end| end == 0) {
        bail!("call {call} of the timed loop (0: the lead-in) stamped no end on the GPU");
    }
    if let Some(call) = ends_ns.windows(2).position(|pair| pair[1] < pair[0]) {
        bail!(
            "timed call {} ended on the GPU before the call before it",
            call + 1
        );
    }
    Ok(ends_ns
        .iter()
        .skip(1)
        .map(|end| (end - ends_ns[0]) as f64 / 1e3)
        .collect())
}

/// Each call's time from the calls' ends after a common start.
fn gaps_us(ends_us: &[f64]) -> Vec<f64> {
    let mut before = 0.0;
    ends_us
        .iter()
        .map(|&end| {
            let gap = end - before;
            before = end;
            gap
        })
        .collect()
}

/// A size as the bench header names it.
fn size_name(bytes: usize) -> String {
    match bytes {
        usize::MAX => "any size".to_owned(),
        _ if bytes.is_multiple_of(1 << 20) => format!("{} MiB", bytes >> 20),
        _ if bytes.is_multiple_of(1 << 10) => format!("{} KiB", bytes >> 10),
        _ => format!("{bytes} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::{ends_since_lead_in_us, gaps_us};

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} against {want:?}");
        for (got_one, want_one) in got.iter().zip(want) {
            assert!(
                (got_one - want_one).abs() < 1e-9,
                "{got:?} against {want:?}"
            );
        }
    }

    #[test]
    fn calls_timed_on_the_gpu_count_from_the_lead_in() {
        let ends = ends_since_lead_in_us(&[1_000_000, 1_011_232, 1_022_000, 1_022_032]).unwrap();
        assert_close(&ends, &[11.232, 22.0, 22.032]);
        assert_close(&gaps_us(&ends), &[11.232, 10.768, 0.032]);
    }

    #[test]
    fn the_job_ends_a_call_when_its_last_rank_does() {
        // Two ranks on clocks 5 s apart, whose ends of a call take turns
        // being 1 µs late: the job's calls take 11, 10 and 10 µs, where each
        // rank's own gaps run 9 to 11 and the slower of the two is 11 every
        // call.
        let rank_0 = [5_000_000_000, 5_000_011_000, 5_000_020_000, 5_000_031_000];
        let rank_1 = [
            10_000_000_000,
            10_000_010_000,
            10_000_021_000,
            10_000_030_000,
        ];
        let (mut job, rank_1) = (
            ends_since_lead_in_us(&rank_0).unwrap(),
            ends_since_lead_in_us(&rank_1).unwrap(),
        );
        for (end, other) in job.iter_mut().zip(rank_1) {
            *end = end.max(other);
        }
        assert_close(&gaps_us(&job), &[11.0, 10.0, 10.0]);
    }

    #[test]
    fn a_call_without_an_end_or_ending_early_is_no_time() {
        let unstamped = ends_since_lead_in_us(&[5_000, 0, 9_000])
            .unwrap_err()
            .to_string();
        assert!(
            unstamped.contains("call 1 ") && unstamped.contains("stamped no end"),
            "{unstamped}"
        );
        let early = ends_since_lead_in_us(&[5_000, 9_000, 8_000])
            .unwrap_err()
            .to_string();
        assert!(early.contains("timed call 2 ended"), "{early}");
    }
}
