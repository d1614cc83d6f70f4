//! `pcieipc bench`: nccl-tests' all_reduce_perf over local ranks. Without
//! `--rank` it starts `--nranks` copies of itself, one per rank, and waits for
//! them; with `--rank` it is one rank of such a job. Rank 0 prints the table (or
//! the JSON of docs/schemas/bench-v1.schema.json).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pcieipc::engine::cuda::{
    CudaCommunicator, CudaOptions, Gpu, Handoff, HostLinks, PeerRead, PeerToPeer, MEASURED_COPIES,
    MEASURED_COPY_BYTES,
};
use pcieipc::engine::{
    bf16, f16, transport, AlgorithmChoice, ChunkPolicy, CommOptions, Communicator, DType, Element,
    JobSecret, LinkDevice, LinkFacts, ReduceOp, StreamingStores, TransportOptions, SECRET_ENV,
};
use pcieipc::probe::{Bdf, HealthModel, Topology};
use pcieipc::trace::TRACE_ENV;
use serde_json::json;

use crate::bench_collective::{Collective, QUEUED_AHEAD};
use crate::bench_latency::{parse_peer_calls, Distribution, PeerCalls, Placement, PERCENTILES};
use crate::cmd_trace::TraceParts;
use crate::latency_svg::{latency_svg, PlotRow};

/// A host transport of the engine, or the CUDA backend.
#[derive(Clone, Debug)]
enum BenchTransport {
    Host(TransportOptions),
    Cuda,
}

impl std::str::FromStr for BenchTransport {
    type Err = String;
    fn from_str(name: &str) -> Result<BenchTransport, String> {
        match name {
            "cuda" => Ok(BenchTransport::Cuda),
            _ => name
                .parse()
                .map(BenchTransport::Host)
                .map_err(|unknown| format!("{unknown}, or cuda")),
        }
    }
}

/// `--transport`'s help: the registry's transports, then the CUDA backend.
fn transport_help() -> String {
    format!(
        "Transport between the ranks: {}, or cuda (GPU buffers, CUDA IPC and peer-to-peer kernels)",
        transport::describe_all()
    )
}

#[derive(clap::Args)]
pub struct Args {
    /// Smallest message size in bytes (K, M, G suffixes: powers of 1024).
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", default_value = "32M", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest message size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", default_value = "32M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// Multiply the size by this factor between steps.
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "FACTOR",
        default_value_t = 2
    )]
    step_factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup_iters: usize,
    /// Check results: 0 not, 1 one call per size and placement (as
    /// nccl-tests), 2 every call, warm-up and timed, each one at a time
    /// (the timed calls' time excludes their checks, so it is not the
    /// back-to-back time of 0 and 1).
    #[arg(short = 'c', long = "check", value_name = "0|1|2", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=2))]
    check: u8,
    /// Element type: float, double, half, bfloat16, int32, int64, uint8.
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "float"
    )]
    datatype: DType,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: ReduceOp,
    /// Ranks to start on this host.
    #[arg(long, default_value_t = 2)]
    nranks: usize,
    #[arg(long, default_value = "shm", help = transport_help())]
    transport: BenchTransport,
    /// With --transport cuda: the GPU of each rank, comma-separated (rank r
    /// takes the r-th; several ranks may share one). Default: rank r on GPU
    /// r mod the number of GPUs.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    gpus: Vec<usize>,
    /// With --transport cuda: `off` moves every all_reduce through host
    /// memory instead of peer-to-peer: kernels write and read pinned shared
    /// memory on the GPU hand-off, or the ranks stage it on the host hand-off.
    #[arg(long, value_name = "auto|off", default_value = "auto", value_parser = ["auto", "off"])]
    p2p: String,
    /// all_reduce algorithm: auto (by size, rank count and whether ranks may
    /// read each other's memory), ring, one-shot, direct (shm only).
    #[arg(long, default_value = "auto")]
    algorithm: AlgorithmChoice,
    /// Chunk size in bytes instead of the chunk policy's (by link and message size).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    chunk_bytes: Option<usize>,
    /// Chunks the ring's first step may run ahead.
    #[arg(long, value_name = "CHUNKS")]
    in_flight: Option<usize>,
    /// Bytes a rank may read from its peers on the one-shot path (sets the
    /// crossover). Default: 16 KiB on the host transports; CUDA 256 KiB, and
    /// 1 MiB on the GPU hand-off through host memory.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    one_shot_bytes: Option<usize>,
    /// Microseconds a waiting rank spins before it sleeps on the futex.
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// shm: `auto` lets ranks read each other's buffers (process_vm_readv)
    /// where every rank may: the direct all_reduce, and the ring's all-gather
    /// reading finished chunks straight from the predecessor; `off` keeps to
    /// the ring, copying twice through the relay slots.
    #[arg(long, value_name = "auto|off", default_value = "auto", value_parser = ["auto", "off"])]
    single_copy: String,
    /// shm: the working set (every rank's input, and output when out of
    /// place, together; K, M, G suffixes) from which the ring's first step
    /// fills its slots with non-temporal stores; `auto`: the last-level
    /// cache's size, and below it plain or non-temporal fills as the calls
    /// measure; `off`: never.
    #[arg(long, value_name = "auto|off|BYTES", default_value = "auto", value_parser = parse_streaming_stores)]
    streaming_stores: StreamingStores,
    /// With --transport cuda: how a reduce step reads the predecessor's
    /// chunk: `direct` (the kernel loads peer memory) or `copy-engine` (a
    /// copy into local memory first).
    #[arg(long, value_name = "direct|copy-engine", default_value = "direct", value_parser = ["direct", "copy-engine"])]
    peer_read: String,
    /// With --transport cuda: microseconds a rank polls its GPU's completion
    /// event before it sleeps on it.
    #[arg(long, value_name = "US")]
    gpu_poll_us: Option<u64>,
    /// With --transport cuda: where ranks hand over: `gpu` (flags in each
    /// other's memory, one kernel per call, calls queued on a stream and
    /// timed as nccl-tests does: N calls, then one synchronize; through
    /// pinned host memory with --p2p off), `host` (ranks meet on the host
    /// after every step), `auto` (gpu when every rank has a GPU of its own).
    #[arg(long, value_name = "auto|gpu|host", default_value = "auto", value_parser = ["auto", "gpu", "host"])]
    handoff: String,
    /// Records every rank's timeline (calls, steps, waits, sleeps, link
    /// events) into FILE, Chrome trace-event JSON for Perfetto UI or
    /// chrome://tracing (`pcieipc trace summary FILE` sums it up).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// With --transport cuda on the GPU hand-off: bytes of each inbox and
    /// result slot (a one-shot launch carries up to one, a two-shot launch
    /// one per rank; larger messages take several launches). Default: 32
    /// MiB / N.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    handoff_window: Option<usize>,
    /// With --transport cuda on the GPU hand-off: the most thread blocks a
    /// launch takes, the multiprocessors its kernels hold while they wait
    /// for peers (fewer leave more to the job's own kernels). Default: one
    /// a multiprocessor, up to 64.
    #[arg(long, value_name = "1..64", value_parser = clap::value_parser!(u32).range(1..=64))]
    handoff_blocks: Option<u32>,
    /// With --transport cuda on the GPU hand-off through host memory (--p2p
    /// off): the two-shot launches of this many bytes and more move by the
    /// GPU's copy engines, smaller ones by the kernels' loads and stores;
    /// `never`: always the kernels. Default: 4M.
    #[arg(long, value_name = "BYTES|never", value_parser = parse_copy_engines_from)]
    copy_engines_from: Option<usize>,
    /// With --transport cuda on the GPU hand-off through host memory, by the
    /// copy engines: about how many bytes of each rank's segment move
    /// between two of its flags at most (16 to 1G; at least 2 chunks a
    /// segment, at most 63 a launch). Default: 4M.
    #[arg(long, value_name = "BYTES", value_parser = parse_copy_chunk)]
    copy_chunk: Option<usize>,
    /// With --transport cuda on the GPU hand-off: capture the timed calls in
    /// a CUDA graph and time one replay of it (nccl-tests' -G).
    #[arg(short = 'G', long)]
    graph: bool,
    /// Instead of the table: at each size, ITERS out-of-place calls from
    /// cold (no warm-up), each timed on its own (the slowest rank's time),
    /// and how many calls it took to come within 10% of the steady time
    /// (the median of the last quarter), with the page faults the calls
    /// took (the first, and all the others: the most of any rank's).
    #[arg(long)]
    cold_start: bool,
    /// Instead of the sweep: rank 0 waits in one 8-byte all_reduce for peers
    /// that arrive this many milliseconds late, and reports its CPU time.
    #[arg(long, value_name = "MS")]
    late_peer_ms: Option<u64>,
    /// pcieipc: after the kernel recovered a rank's device from a non-fatal
    /// AER error, retrain its link where it reads degraded; the next calls'
    /// chunk follows the speed it trains to (docs/fault-path.md).
    #[arg(long)]
    retrain_degraded: bool,
    /// Chunk checksums (docs/fault-path.md): every message carries a
    /// checksum, checked on receipt, read again and resent while damaged.
    /// `auto`: on where the transport's windows are device memory (pcieipc).
    #[arg(long, value_name = "auto|on|off", default_value = "auto", value_parser = ["auto", "on", "off"])]
    chunk_checksums: String,
    /// For tests of the checksums: every rank damages the CHUNK-th chunk it
    /// sends (from 0) in its slot after checksumming it, on its first WRITES
    /// writes (1: the post; more: its resends too, and above 4 the call
    /// fails with the message named).
    #[arg(long, value_name = "CHUNK[xWRITES]")]
    damage_chunk: Option<pcieipc::engine::DamageInjection>,
    /// shm: the PCI function whose path to its host bridge the ranks' data
    /// crosses, comma-separated per rank (one serves all). Each rank's chunk
    /// then follows that path's bottleneck link and health as the probe sees
    /// them under --sysfs-root, instead of host memory's table by message size.
    #[arg(long, value_name = "BDF[,BDF...]", value_delimiter = ',')]
    link_of: Vec<Bdf>,
    /// The sysfs tree --link-of probes: `/` on a live machine, a fixture's
    /// directory in tests.
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysfs_root: PathBuf,
    /// Bind rank r to CPU r when there are at least as many CPUs as ranks, as
    /// mpirun does; `none` (or more ranks than CPUs) leaves placement to the
    /// scheduler.
    #[arg(long, value_name = "core|none", default_value = "core", value_parser = ["core", "none"])]
    bind_to: String,
    /// Time every timed call on its own (the slowest rank's; on the GPU
    /// hand-off between the job's ends of successive calls, which the
    /// queued calls stamp on the GPU, queued ahead before they run) and
    /// give each size's
    /// p50, p90, p99, p99.7, max and standard deviation: after the table, or
    /// in the JSON report. Off, the timed calls read no clock between them,
    /// as nccl-tests' and the OpenMPI program's do not: the reads cost tens
    /// of nanoseconds a call, a fifth of an 8-byte call.
    #[arg(long)]
    latency: bool,
    /// Draw each size's per-call latency distribution into FILE (SVG), with
    /// --latency-peer's beside it (times each call as --latency does).
    #[arg(long, value_name = "FILE.svg")]
    latency_plot: Option<PathBuf>,
    /// The peer's per-call times for --latency-plot: the output of
    /// `bench/mpi_allreduce --latency` or `bench/nccl_allreduce.py --latency`
    /// ("calls SIZE oop|ip T1 ... TN" lines).
    #[arg(long, value_name = "FILE", requires = "latency_plot")]
    latency_peer: Option<PathBuf>,
    /// What the plot calls the peer.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "MPI_Allreduce",
        requires = "latency_peer"
    )]
    latency_peer_name: String,
    /// Print JSON (docs/schemas/bench-v1.schema.json; with --cold-start,
    /// bench-cold-start-v1.schema.json) instead of the table.
    #[arg(long)]
    json: bool,
    /// Run as this rank of a job started elsewhere (with --rendezvous).
    #[arg(long, requires = "rendezvous")]
    rank: Option<usize>,
    /// The job's rendezvous name (with --rank).
    #[arg(long, requires = "rank")]
    rendezvous: Option<String>,
}

fn parse_streaming_stores(text: &str) -> Result<StreamingStores, String> {
    match text {
        "auto" => Ok(StreamingStores::Auto),
        "off" => Ok(StreamingStores::Off),
        bytes => parse_bytes(bytes).map(StreamingStores::From),
    }
}

fn parse_copy_engines_from(text: &str) -> Result<usize, String> {
    match text {
        "never" => Ok(usize::MAX),
        bytes => parse_bytes(bytes),
    }
}

fn parse_copy_chunk(text: &str) -> Result<usize, String> {
    parse_bytes(text).and_then(|bytes| match bytes {
        16..=0x4000_0000 => Ok(bytes),
        _ => Err(format!("{text:?}: a copy-engine chunk is 16 bytes to 1G")),
    })
}

fn parse_bytes(text: &str) -> Result<usize, String> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (a number with an optional K, M or G)"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.step_factor < 2 {
        bail!("--stepfactor must be at least 2, got {}", args.step_factor);
    }
    if args.min_bytes > args.max_bytes {
        bail!(
            "--minbytes {} exceeds --maxbytes {}",
            args.min_bytes,
            args.max_bytes
        );
    }
    if args.check == 2 && args.graph {
        bail!("-c 2 checks each call on its own: it cannot time a graph replay (-G)");
    }
    if args.graph && (args.latency || args.latency_plot.is_some()) {
        bail!("--latency and --latency-plot time each call: a graph replay (-G) is timed whole");
    }
    if args.cold_start && (args.latency || args.latency_plot.is_some()) {
        bail!("--cold-start already reports each call's time: --latency and --latency-plot are for the sweep");
    }
    match (args.rank, args.rendezvous.clone()) {
        (Some(rank), Some(rendezvous)) => run_rank(&args, rank, &rendezvous),
        _ => launch(&args),
    }
}

/// Starts one process per rank (this executable with `--rank`), waits for all,
/// says how each failed rank ended, and exits with the first one's status.
fn launch(args: &Args) -> anyhow::Result<ExitCode> {
    if args.nranks == 0 {
        bail!("--nranks must be at least 1");
    }
    if let BenchTransport::Cuda = args.transport {
        // One clear error here rather than one per rank.
        let count = Gpu::count().context("--transport cuda")?;
        if count == 0 {
            bail!("--transport cuda: this machine has no GPU");
        }
    }
    // Bad --link-of values fail here once, not in every rank.
    for rank in 0..args.nranks {
        link_of(args, rank)?;
    }
    // As do a peer file that is not one and a plot with nowhere to go,
    // before any size is measured.
    if let Some(peer) = &args.latency_peer {
        peer_calls(peer)?;
    }
    if let Some(plot) = &args.latency_plot {
        let directory = match plot.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => std::path::Path::new("."),
        };
        if !directory.is_dir() {
            bail!(
                "--latency-plot {}: no directory {} to write it in",
                plot.display(),
                directory.display()
            );
        }
    }
    let exe = std::env::current_exe().context("finding this executable to start the ranks")?;
    let rendezvous = format!("bench-{}", std::process::id());
    // Only the ranks started here hold it: nobody else can join the job.
    let secret = JobSecret::generate().context("making the job's secret")?;
    let passed: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let trace_parts = args.trace.as_ref().map(|_| TraceParts::new()).transpose()?;
    let mut children = Vec::with_capacity(args.nranks);
    for rank in 0..args.nranks {
        let mut command = Command::new(&exe);
        command
            .args(&passed)
            .args(["--rank", &rank.to_string(), "--rendezvous", &rendezvous])
            .env(SECRET_ENV, secret.to_hex());
        if let Some(parts) = &trace_parts {
            command.env(TRACE_ENV, parts.prefix());
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting rank {rank}"))?;
        children.push((rank, child));
    }
    let mut exit = ExitCode::SUCCESS;
    let mut failed = false;
    for index in 0..children.len() {
        let (rank, child) = &mut children[index];
        let status = child
            .wait()
            .with_context(|| format!("waiting for rank {rank}"))?;
        if status.signal() == Some(nix::sys::signal::Signal::SIGPIPE as i32) {
            // The table's reader went away (`| head`): the ranks still
            // running have nothing left to report to; end them and go
            // quietly, as the rank that printed did.
            for (_, other) in &mut children[index + 1..] {
                let _ = other.kill();
                let _ = other.wait();
            }
            return Ok(ExitCode::from(
                128 + nix::sys::signal::Signal::SIGPIPE as u8,
            ));
        }
        // Every failed rank is said (one killed by a signal is never
        // hidden behind another's error); the first one's status is the job's.
        if !status.success() {
            crate::output::eprint_line(&format!("pcieipc bench: rank {rank} {status}"));
            if !failed {
                failed = true;
                exit = ExitCode::from(status.code().map_or(2, |code| code.clamp(1, 255) as u8));
            }
        }
    }
    if let (Some(parts), Some(file)) = (&trace_parts, &args.trace) {
        let ranks = parts.merge_into(file)?;
        crate::output::eprint_line(&format!("# trace: {} ({ranks} ranks)", file.display()));
    }
    Ok(exit)
}

/// Whether each timed call is timed on its own (`--latency`, `--latency-plot`).
fn per_call(args: &Args) -> bool {
    args.latency || args.latency_plot.is_some()
}

/// The per-call times in `--latency-peer`'s file.
fn peer_calls(path: &std::path::Path) -> anyhow::Result<Vec<PeerCalls>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--latency-peer: reading {}", path.display()))?;
    parse_peer_calls(&text).with_context(|| format!("--latency-peer: {}", path.display()))
}

/// A rank's options; the job's secret comes from the launcher
/// (`PCIEIPC_JOB_SECRET`).
fn options(args: &Args, rank: usize) -> anyhow::Result<CommOptions> {
    let defaults = CommOptions::default();
    let secret = JobSecret::from_env().context("reading the job's secret")?;
    let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
    Ok(CommOptions {
        // Like mpirun, bind only while every rank gets a core of its own: a
        // bound rank polls without yielding, which ranks sharing a core must not.
        bind_cpu: (args.bind_to == "core" && args.nranks <= cpus).then_some(rank),
        transport: match &args.transport {
            BenchTransport::Host(transport) => transport.clone(),
            BenchTransport::Cuda => TransportOptions::default(),
        },
        algorithm: args.algorithm,
        chunk_policy: args
            .chunk_bytes
            .map_or(defaults.chunk_policy, ChunkPolicy::fixed),
        in_flight: args.in_flight.unwrap_or(defaults.in_flight),
        one_shot_read_budget: args.one_shot_bytes.unwrap_or(defaults.one_shot_read_budget),
        spin: args.spin_us.map_or(defaults.spin, Duration::from_micros),
        single_copy: args.single_copy == "auto",
        streaming_stores: args.streaming_stores,
        retrain_degraded: args.retrain_degraded,
        chunk_checksums: match args.chunk_checksums.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        damage: args.damage_chunk,
        secret,
        ..defaults
    })
}

/// The function `--link-of` gives `rank`, and its link as the probe sees it.
fn link_of(args: &Args, rank: usize) -> anyhow::Result<Option<(LinkFacts, LinkDevice)>> {
    let bdf = match args.link_of.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        per_rank if per_rank.len() == args.nranks => per_rank[rank],
        per_rank => bail!(
            "--link-of names {} functions for {} ranks: give one for all, or one per rank",
            per_rank.len(),
            args.nranks
        ),
    };
    match &args.transport {
        BenchTransport::Host(transport) if transport.capabilities().link_events => bail!(
            "--link-of is for transports without link events: the {} transport follows its \
             device's link itself",
            transport.name()
        ),
        BenchTransport::Cuda => bail!("--link-of is for host transports: the CUDA chunk is fixed"),
        BenchTransport::Host(_) => {}
    }
    let root = &args.sysfs_root;
    let topology = Topology::from_sysfs_root(root, HealthModel::default())
        .with_context(|| format!("--link-of: probing sysfs under {}", root.display()))?;
    let device = topology.find(bdf).with_context(|| {
        format!(
            "--link-of: no PCI function {bdf} under {}",
            root.join("sys").display()
        )
    })?;
    let facts = LinkFacts::of_device(&topology, device).with_context(|| {
        format!("--link-of: no link of known speed and width between {bdf} and its host bridge")
    })?;
    Ok(Some((
        facts,
        LinkDevice {
            bdf,
            root: root.clone(),
        },
    )))
}

fn run_rank(args: &Args, rank: usize, rendezvous: &str) -> anyhow::Result<ExitCode> {
    let joining = || format!("rank {rank} joining {rendezvous:?}");
    match args.transport {
        BenchTransport::Host(_) => {
            let link = link_of(args, rank)?;
            let options = CommOptions {
                link: link.as_ref().map(|(facts, _)| *facts),
                link_device: link.map(|(_, device)| device),
                ..options(args, rank)?
            };
            let comm =
                Communicator::init(rendezvous, rank, args.nranks, options).with_context(joining)?;
            let init = comm.init_time();
            run_collective(comm, args, init)
        }
        BenchTransport::Cuda => {
            let ordinal = match args.gpus.get(rank) {
                Some(ordinal) => *ordinal,
                None if args.gpus.is_empty() => {
                    rank % Gpu::count().context("counting GPUs")?.max(1)
                }
                None => bail!(
                    "--gpus names {} GPUs for {} ranks",
                    args.gpus.len(),
                    args.nranks
                ),
            };
            let gpu =
                Gpu::open(ordinal).with_context(|| format!("rank {rank} opening GPU {ordinal}"))?;
            let defaults = CudaOptions::default();
            let comm = CudaCommunicator::init(
                rendezvous,
                rank,
                args.nranks,
                gpu,
                CudaOptions {
                    control: options(args, rank)?,
                    chunk_bytes: args.chunk_bytes.unwrap_or(defaults.chunk_bytes),
                    one_shot_read_budget: args.one_shot_bytes,
                    algorithm: args.algorithm,
                    peer_to_peer: if args.p2p == "off" {
                        PeerToPeer::Off
                    } else {
                        PeerToPeer::Auto
                    },
                    peer_read: if args.peer_read == "copy-engine" {
                        PeerRead::CopyEngine
                    } else {
                        PeerRead::Direct
                    },
                    gpu_poll: args
                        .gpu_poll_us
                        .map_or(defaults.gpu_poll, Duration::from_micros),
                    handoff: match args.handoff.as_str() {
                        "gpu" => Handoff::Gpu,
                        "host" => Handoff::Host,
                        _ => Handoff::Auto,
                    },
                    handoff_window: args.handoff_window,
                    handoff_blocks: args.handoff_blocks,
                    copy_engines_from: args.copy_engines_from,
                    copy_chunk_bytes: args.copy_chunk,
                    ..defaults
                },
            )
            .with_context(joining)?;
            let init = comm.init_time();
            run_collective(comm, args, init)
        }
    }
}

fn run_collective<C: Collective>(
    mut comm: C,
    args: &Args,
    init: Duration,
) -> anyhow::Result<ExitCode> {
    // The slowest rank's init time is the job's.
    let mut init_ms = [init.as_secs_f64() * 1e3];
    comm.host()
        .all_reduce_in_place(&mut init_ms, ReduceOp::Max)?;
    if let Some(late_ms) = args.late_peer_ms {
        return late_peer(&mut comm, Duration::from_millis(late_ms), args.spin_us);
    }
    if args.cold_start {
        return pcieipc::with_element!(args.datatype, T => cold_start::<C, T>(&mut comm, args));
    }
    pcieipc::with_element!(args.datatype, T => sweep::<C, T>(&mut comm, args, init_ms[0]))
}

/// How a size's first calls went (`--cold-start`).
struct ColdStart {
    /// Every call's time, the slowest rank's (µs).
    calls_us: Vec<f64>,
    /// The median of the last quarter of the calls.
    steady_us: f64,
    /// The first call within 10% of `steady_us`, counted from 1.
    calls_to_steady: usize,
}

impl ColdStart {
    fn new(calls_us: Vec<f64>) -> ColdStart {
        let mut tail = calls_us[calls_us.len() - calls_us.len().div_ceil(4)..].to_vec();
        tail.sort_by(f64::total_cmp);
        let steady_us = tail[tail.len() / 2];
        let calls_to_steady = calls_us
            .iter()
            .position(|&us| us <= steady_us * 1.1)
            .map_or(calls_us.len(), |index| index + 1);
        ColdStart {
            calls_us,
            steady_us,
            calls_to_steady,
        }
    }
}

/// `--cold-start`: each size from cold, call by call.
fn cold_start<C: Collective, T: BenchElement>(
    comm: &mut C,
    args: &Args,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.iters >= 4,
        "--cold-start needs -n 4 or more calls per size"
    );
    let leader = comm.rank() == 0;
    let (rank, op) = (comm.rank(), args.op);
    let sizes = sizes(args, std::mem::size_of::<T>());
    if leader && !args.json {
        println!("# pcieipc bench --cold-start: all_reduce out of place, {} ranks, {}, {} calls per size from cold, each the slowest rank's", comm.nranks(), comm.describe(), args.iters);
        println!("#       size   first (us)  second (us)  steady (us)  calls to within 10%  faults first  faults after");
    }
    let mut rows = Vec::with_capacity(sizes.len());
    for bytes in sizes {
        let count = bytes / std::mem::size_of::<T>();
        let host_input: Vec<T> = (0..count).map(|index| pattern(rank, index, op)).collect();
        let input = comm.upload(&host_input)?;
        let mut output = comm.upload(&host_input)?;
        let mut calls_us = Vec::with_capacity(args.iters);
        let mut faults = Vec::with_capacity(args.iters);
        for _ in 0..args.iters {
            let faulted = thread_page_faults()?;
            let started = Instant::now();
            comm.all_reduce(&input, &mut output, op)?;
            comm.wait_queued()?;
            calls_us.push(started.elapsed().as_secs_f64() * 1e6);
            faults.push(thread_page_faults()?.saturating_sub(faulted) as f64);
        }
        comm.host()
            .all_reduce_in_place(&mut calls_us, ReduceOp::Max)?;
        comm.host()
            .all_reduce_in_place(&mut faults, ReduceOp::Max)?;
        let cold = ColdStart::new(calls_us);
        if leader && !args.json {
            println!(
                "{bytes:>12}  {:>11.2}  {:>11.2}  {:>11.2}  {:>19}  {:>12}  {:>12}",
                cold.calls_us[0],
                cold.calls_us[1],
                cold.steady_us,
                cold.calls_to_steady,
                faults[0],
                faults[1..].iter().sum::<f64>()
            );
        }
        rows.push(json!({
            "size_bytes": bytes,
            "calls_us": cold.calls_us,
            "page_faults": faults,
            "steady_us": cold.steady_us,
            "calls_to_steady": cold.calls_to_steady,
        }));
    }
    if leader && args.json {
        let report = json!({
            "schema_version": 1,
            "collective": "all_reduce",
            "mode": "cold_start",
            "nranks": comm.nranks(),
            "transport": comm.transport_name(),
            "path": comm.describe(),
            "datatype": T::DTYPE.name(),
            "op": op.name(),
            "iters": args.iters,
            "results": rows,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Page faults this thread has taken (minor and major: a first touch of
/// memory, or a page populated ahead of it).
fn thread_page_faults() -> anyhow::Result<u64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
        .context("getrusage")?;
    Ok((usage.minor_page_faults() + usage.major_page_faults()) as u64)
}

/// CPU time this thread has run, from the scheduler's own accounting
/// (nanoseconds, unlike the 10 ms ticks of getrusage on many kernels).
fn thread_cpu_time() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .context("reading /proc/thread-self/schedstat")?;
    let nanos: u64 = stat
        .split_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .context("parsing /proc/thread-self/schedstat")?;
    Ok(Duration::from_nanos(nanos))
}

/// Rank 0 enters an 8-byte all_reduce `late` before the others and reports the
/// CPU time it burns waiting for them.
fn late_peer<C: Collective>(
    comm: &mut C,
    late: Duration,
    spin_us: Option<u64>,
) -> anyhow::Result<ExitCode> {
    // One call first, so the measured one has nothing left to set up
    // (the CUDA transport compiles its kernels on first use).
    let mut warm_up = comm.upload(&[1.0f64])?;
    comm.all_reduce_in_place(&mut warm_up, ReduceOp::Sum)?;
    let mut buffer = comm.upload(&[1.0f64])?;
    if comm.rank() != 0 {
        std::thread::sleep(late);
    }
    let cpu_before = thread_cpu_time()?;
    let started = Instant::now();
    comm.all_reduce_in_place(&mut buffer, ReduceOp::Sum)?;
    let (wall, cpu) = (started.elapsed(), thread_cpu_time()? - cpu_before);
    let value = comm.download(&buffer)?;
    if comm.rank() == 0 {
        let spin = spin_us.map_or(CommOptions::default().spin, Duration::from_micros);
        println!(
            "# late peer: rank 0 waited {:.1} ms for peers {} ms late, using {:.3} ms of CPU (spin {} us)",
            wall.as_secs_f64() * 1e3,
            late.as_millis(),
            cpu.as_secs_f64() * 1e3,
            spin.as_micros()
        );
    }
    if value[0] != comm.nranks() as f64 {
        bail!(
            "late-peer all_reduce returned {} instead of {}",
            value[0],
            comm.nranks()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Element types the checker can fill with small integers, exactly
/// representable in every type, so every rank's result must match exactly.
trait BenchElement: Element + Default {
    fn from_small(value: u8) -> Self;
}

macro_rules! bench_element {
    ($ty:ty, $convert:expr) => {
        impl BenchElement for $ty {
            fn from_small(value: u8) -> Self {
                $convert(value)
            }
        }
    };
}

bench_element!(f32, f32::from);
bench_element!(f64, f64::from);
bench_element!(f16, f16::from);
bench_element!(bf16, bf16::from);
bench_element!(i32, i32::from);
bench_element!(i64, i64::from);
bench_element!(u8, |value| value);

/// Rank `rank`'s element `index`: small integers whose sums and products stay
/// exact in half precision (products are powers of two).
fn pattern<T: BenchElement>(rank: usize, index: usize, op: ReduceOp) -> T {
    let value = match op {
        ReduceOp::Sum | ReduceOp::Avg => (index * 7 + rank * 3) % 8,
        ReduceOp::Prod => 1 + (index + rank) % 2,
        ReduceOp::Min | ReduceOp::Max => (index * 13 + rank * 5) % 17,
    };
    T::from_small(value as u8)
}

fn expected<T: BenchElement>(nranks: usize, count: usize, op: ReduceOp) -> Vec<T> {
    (0..count)
        .map(|index| {
            let first = pattern::<T>(0, index, op);
            let fold = |f: fn(T, T) -> T| {
                (1..nranks).fold(first, |acc, rank| f(acc, pattern(rank, index, op)))
            };
            match op {
                ReduceOp::Sum => fold(T::sum),
                ReduceOp::Avg => fold(T::sum).div_by_ranks(nranks),
                ReduceOp::Prod => fold(T::prod),
                ReduceOp::Min => fold(T::min),
                ReduceOp::Max => fold(T::max),
            }
        })
        .collect()
}

/// One half of a table row.
struct Measurement {
    time_us: f64,
    algbw_gb_s: f64,
    busbw_gb_s: f64,
    wrong: u64,
    /// The chunk size the last call of this size moved in (0: one-shot and direct).
    chunk_bytes: u32,
    /// Minor page faults the ranks' processes took during the timed calls,
    /// summed over ranks: a call that keeps faulting pages in pays per page.
    page_faults: u64,
    /// Each timed call's time, the job's: the slowest rank's; `None` for a
    /// graph replay (timed whole) or no timed calls.
    latency: Option<Distribution>,
    /// The share of its measured limit the busiest GPU link to host memory
    /// carried (`HostLinks::utilisation`), where calls cross one.
    link_utilisation: Option<f64>,
}

impl Measurement {
    fn json(&self) -> serde_json::Value {
        let mut object = json!({
            "time_us": self.time_us,
            "algbw_gb_s": self.algbw_gb_s,
            "busbw_gb_s": self.busbw_gb_s,
            "wrong": self.wrong,
            "chunk_bytes": self.chunk_bytes,
            "page_faults": self.page_faults,
        });
        if let Some(latency) = &self.latency {
            object["latency_us"] = latency.json();
        }
        if let Some(utilisation) = self.link_utilisation {
            object["link_utilisation"] = json!(utilisation);
        }
        object
    }
}

fn measure<C: Collective, T: BenchElement>(
    comm: &mut C,
    args: &Args,
    count: usize,
    in_place: bool,
    expected: Option<&[T]>,
) -> anyhow::Result<Measurement> {
    let (rank, nranks, op) = (comm.rank(), comm.nranks(), args.op);
    let host_input: Vec<T> = (0..count).map(|index| pattern(rank, index, op)).collect();
    let input = comm.upload(&host_input)?;
    let mut output = comm.upload(&host_input)?;
    let call = |comm: &mut C, output: &mut C::Buffer<T>| {
        if in_place {
            comm.all_reduce_in_place(output, op)
        } else {
            comm.all_reduce(&input, output, op)
        }
    };
    let queue = |comm: &mut C, output: &mut C::Buffer<T>| {
        if in_place {
            comm.queue_all_reduce_in_place(output, op)
        } else {
            comm.queue_all_reduce(&input, output, op)
        }
    };
    let mut wrong = [0i64];
    let (elapsed, faults, calls) = match expected {
        Some(expected) if args.check == 2 => {
            // Each call on its own, its result compared; an in-place call
            // starts again from the rank's input, as its expected result
            // assumes. Only the calls are timed.
            let mut timed = Duration::ZERO;
            let mut faults = 0;
            let mut calls_us = Vec::with_capacity(args.iters);
            for iteration in 0..args.warmup_iters + args.iters {
                if in_place {
                    output = comm.upload(&host_input)?;
                }
                let faults_before = minor_page_faults()?;
                let started = Instant::now();
                call(comm, &mut output)?;
                comm.wait_queued()?;
                if iteration >= args.warmup_iters {
                    let took = started.elapsed();
                    timed += took;
                    calls_us.push(took.as_secs_f64() * 1e6);
                    faults += minor_page_faults()? - faults_before;
                }
                wrong[0] += wrong_elements(comm, &output, expected)?;
            }
            (timed, faults, per_call(args).then_some(calls_us))
        }
        _ => {
            if let Some(expected) = expected {
                call(comm, &mut output)?;
                wrong[0] = wrong_elements(comm, &output, expected)?;
            }
            back_to_back(comm, args, &mut output, queue)?
        }
    };
    // Before the exchanges below: on a host transport they are calls of the
    // same communicator.
    let chunk_bytes = comm.last_call().map_or(0, |call| call.chunk_bytes);
    if expected.is_some() {
        comm.host().all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    }
    let mut page_faults = [faults as i64];
    comm.host()
        .all_reduce_in_place(&mut page_faults, ReduceOp::Sum)?;
    // A call takes as long as its slowest rank (a training step waits for
    // it; a GPU clock's times are the job's already, the same on every
    // rank).
    let latency = match calls {
        Some(mut calls_us) if !calls_us.is_empty() => {
            comm.host()
                .all_reduce_in_place(&mut calls_us, ReduceOp::Max)?;
            Distribution::of(&calls_us)
        }
        _ => None,
    };
    // nccl-tests reports the time averaged over ranks.
    let mut seconds = [elapsed.as_secs_f64() / args.iters.max(1) as f64];
    comm.host()
        .all_reduce_in_place(&mut seconds, ReduceOp::Avg)?;
    let bytes = (count * std::mem::size_of::<T>()) as f64;
    let algbw = bytes / seconds[0] / 1e9;
    Ok(Measurement {
        time_us: seconds[0] * 1e6,
        algbw_gb_s: algbw,
        busbw_gb_s: algbw * 2.0 * (nranks as f64 - 1.0) / nranks as f64,
        wrong: wrong[0] as u64,
        chunk_bytes,
        page_faults: page_faults[0] as u64,
        latency,
        link_utilisation: None,
    })
}

/// How many elements of `output` differ from `expected`.
fn wrong_elements<C: Collective, T: BenchElement>(
    comm: &mut C,
    output: &C::Buffer<T>,
    expected: &[T],
) -> anyhow::Result<i64> {
    Ok(comm
        .download(output)?
        .iter()
        .zip(expected)
        .filter(|(got, want)| got != want)
        .count() as i64)
}

/// The warm-up calls, then the timed ones as nccl-tests times them: back to
/// back (queued, where the communicator queues them on a stream), or one
/// replay of them captured in a graph, then one wait. Returns their time,
/// the minor page faults they took and, with `--latency` (not for a graph
/// replay), each call's time (µs; on the host this rank's, a clock read
/// between calls; queued on a GPU stream the job's, between its ends of
/// successive calls, which the calls stamp on the GPU, the first timed
/// call's start the end of an untimed lead-in call: `CallClock::calls_us`).
/// Timed on a GPU stream, the calls wait until the first `QUEUED_AHEAD` are
/// queued on every rank, and their time is the sum of the calls' times on
/// the GPU.
fn back_to_back<C: Collective, T: BenchElement>(
    comm: &mut C,
    args: &Args,
    output: &mut C::Buffer<T>,
    queue: impl Fn(&mut C, &mut C::Buffer<T>) -> anyhow::Result<()>,
) -> anyhow::Result<(Duration, u64, Option<Vec<f64>>)> {
    for _ in 0..args.warmup_iters {
        queue(comm, output)?;
    }
    comm.wait_queued()?;
    let graph = if args.graph {
        comm.begin_graph()?;
        for _ in 0..args.iters {
            queue(comm, output)?;
        }
        let graph = comm.end_graph()?;
        // The first replay uploads the graph: untimed.
        graph.launch().context("replaying the CUDA graph")?;
        comm.wait_queued()?;
        Some(graph)
    } else {
        None
    };
    let mut clock = match graph {
        None if per_call(args) => Some(comm.call_clock(args.iters)?),
        _ => None,
    };
    // The ranks leave the warm-up and set up their clocks apart; a barrier,
    // as nccl-tests has before its timed loop, keeps that skew out of the
    // first timed call.
    comm.host().all_reduce_in_place(&mut [0u8], ReduceOp::Max)?;
    let faults_before = minor_page_faults()?;
    let started = Instant::now();
    match (&graph, &mut clock) {
        (Some(graph), _) => graph.launch().context("replaying the CUDA graph")?,
        (None, Some(clock)) => {
            if clock.is_gpu() {
                // The lead-in: its end on the GPU is the first timed call's
                // start.
                queue(comm, output)?;
            }
            clock.mark()?;
            for call in 1..=args.iters {
                queue(comm, output)?;
                clock.mark()?;
                if clock.is_held() && (call == QUEUED_AHEAD || call == args.iters) {
                    // Every rank has its first calls queued: the GPUs start
                    // them together.
                    comm.host().all_reduce_in_place(&mut [0u8], ReduceOp::Max)?;
                    clock.open();
                }
            }
        }
        (None, None) => {
            for _ in 0..args.iters {
                queue(comm, output)?;
            }
        }
    }
    comm.wait_queued()?;
    let mut elapsed = started.elapsed();
    let faults = minor_page_faults()? - faults_before;
    let calls = match clock {
        None => None,
        Some(clock) => {
            let calls_us = clock.calls_us(comm)?;
            if clock.is_gpu() {
                // Calls held until queued: their time is the GPU's, not the
                // host's queuing ahead of them.
                elapsed = Duration::from_secs_f64(calls_us.iter().sum::<f64>() / 1e6);
            }
            Some(calls_us)
        }
    };
    Ok((elapsed, faults, calls))
}

/// Minor page faults of this process so far.
fn minor_page_faults() -> anyhow::Result<u64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .context("getrusage")?;
    Ok(usage.minor_page_faults() as u64)
}

/// The header's lines on the GPUs' links to host memory: each GPU's copy
/// rates and the limit the rows' link use is taken against.
fn print_host_links(links: &HostLinks) {
    for link in &links.links {
        let rate = &link.rate;
        let ranks: Vec<String> = link.ranks.iter().map(usize::to_string).collect();
        println!(
            "# link to host memory, GPU {} ({}, ranks {}): copy engines {:.1} GB/s to the GPU and {:.1} from it alone, {:.1} and {:.1} both at once: limit {:.1} GB/s each way ({} copies of {} MiB)",
            link.ordinal,
            link.pci_address,
            ranks.join(" "),
            rate.to_gpu_gb_s,
            rate.from_gpu_gb_s,
            rate.both_to_gpu_gb_s,
            rate.both_from_gpu_gb_s,
            rate.limit_gb_s(),
            MEASURED_COPIES,
            MEASURED_COPY_BYTES >> 20
        );
    }
    println!("# link use: the bytes each call moves each way across the busiest GPU's link (every rank on it), per second, over that limit");
}

fn host_links_json(links: &HostLinks) -> serde_json::Value {
    links
        .links
        .iter()
        .map(|link| {
            json!({
                "gpu": link.ordinal,
                "pci_address": link.pci_address,
                "ranks": link.ranks,
                "to_gpu_gb_s": link.rate.to_gpu_gb_s,
                "from_gpu_gb_s": link.rate.from_gpu_gb_s,
                "both_to_gpu_gb_s": link.rate.both_to_gpu_gb_s,
                "both_from_gpu_gb_s": link.rate.both_from_gpu_gb_s,
                "limit_gb_s": link.rate.limit_gb_s(),
            })
        })
        .collect()
}

fn sizes(args: &Args, element_bytes: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = args.min_bytes;
    loop {
        sizes.push(size / element_bytes * element_bytes);
        match size.checked_mul(args.step_factor) {
            // A size of 0 never grows: it is measured once.
            Some(next) if next > size && next <= args.max_bytes => size = next,
            _ => break,
        }
    }
    sizes
}

/// The first all_reduce after init, of two elements of `T` with `op`, to
/// its result on the host, in milliseconds, the slowest rank's: what a job's
/// first call costs beyond the steady state (the CUDA transport loads its
/// kernels for the element type and reduction then: from the kernel store,
/// or compiled).
fn first_call<C: Collective, T: BenchElement>(comm: &mut C, op: ReduceOp) -> anyhow::Result<f64> {
    let mut buffer = comm.upload(&[T::from_small(1), T::from_small(2)])?;
    let started = Instant::now();
    comm.all_reduce_in_place(&mut buffer, op)?;
    comm.download(&buffer)?;
    let mut first_call_ms = [started.elapsed().as_secs_f64() * 1e3];
    comm.host()
        .all_reduce_in_place(&mut first_call_ms, ReduceOp::Max)?;
    Ok(first_call_ms[0])
}

fn sweep<C: Collective, T: BenchElement>(
    comm: &mut C,
    args: &Args,
    init_ms: f64,
) -> anyhow::Result<ExitCode> {
    let leader = comm.rank() == 0;
    let nranks = comm.nranks();
    let element_bytes = std::mem::size_of::<T>();
    let sizes = sizes(args, element_bytes);
    let dtype = T::DTYPE.name();
    let op = args.op.name();
    let first_call_ms = first_call::<C, T>(comm, args.op)?;
    if leader && !args.json {
        println!(
            "# pcieipc bench: all_reduce, {nranks} ranks, {}, algorithm {}, chunks {}, init {init_ms:.2} ms, first call {first_call_ms:.3} ms (slowest rank each)",
            comm.describe(),
            match args.algorithm {
                AlgorithmChoice::Auto => "auto".to_owned(),
                AlgorithmChoice::Fixed(algorithm) => algorithm.name().to_owned(),
            },
            args.chunk_bytes
                .map_or_else(|| comm.default_chunks(), |bytes| format!("{bytes} B"))
        );
    }
    // Measured before any size, with nothing else on the GPUs: every
    // row's link utilisation is taken against it.
    let host_links = comm.host_links()?;
    if leader && !args.json {
        if let Some(links) = &host_links {
            print_host_links(links);
        }
        let (links_over, links_title, links_unit) = match &host_links {
            Some(_) => ("       link use", "    oop    ip", "   (of limit)"),
            None => ("", "", ""),
        };
        println!("#");
        println!("#                                                              out-of-place                       in-place          {links_over}");
        println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong     chunk{links_title}");
        println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)              (B){links_unit}");
    }
    // On stderr, and hidden where stderr is not a terminal (or TERM is
    // unset or dumb): indicatif's stderr target, so that stdout, the table,
    // is the same byte for byte either way and logs get no escape codes. It
    // redraws when a size starts or ends, never from a ticking thread that
    // would share the leader's core with the timed calls.
    let progress = if leader && sizes.len() > 1 {
        indicatif::ProgressBar::with_draw_target(
            Some(sizes.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        )
    } else {
        indicatif::ProgressBar::hidden()
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} measuring {msg} ({elapsed} elapsed)")
            .expect("static progress template"),
    );
    let mut rows = Vec::with_capacity(sizes.len());
    let mut latencies = Vec::with_capacity(2 * sizes.len());
    let mut faulting = Vec::new();
    let mut total_wrong = 0;
    let mut busbw_sum = 0.0;
    for (step, bytes) in sizes.iter().enumerate() {
        let count = bytes / element_bytes;
        // The step in the message: the bar's position counts finished sizes.
        progress.set_message(format!("size {}/{}: {bytes} B", step + 1, sizes.len()));
        let reference = (args.check != 0).then(|| expected::<T>(nranks, count, args.op));
        let mut out_of_place = measure::<C, T>(comm, args, count, false, reference.as_deref())?;
        let mut in_place = measure::<C, T>(comm, args, count, true, reference.as_deref())?;
        if let (Some(links), Some(moved)) = (&host_links, comm.host_link_bytes::<T>(count)) {
            for measured in [&mut out_of_place, &mut in_place] {
                measured.link_utilisation = Some(links.utilisation(moved, measured.time_us / 1e6));
            }
        }
        total_wrong += out_of_place.wrong + in_place.wrong;
        if out_of_place.page_faults + in_place.page_faults > 0 {
            faulting.push(format!(
                "{bytes} B: {}/{}",
                out_of_place.page_faults, in_place.page_faults
            ));
        }
        busbw_sum += out_of_place.busbw_gb_s + in_place.busbw_gb_s;
        if leader && !args.json {
            progress.suspend(|| {
                let link_use = match (out_of_place.link_utilisation, in_place.link_utilisation) {
                    (Some(out_of_place), Some(in_place)) => {
                        format!("  {out_of_place:>5.2} {in_place:>5.2}")
                    }
                    _ => String::new(),
                };
                println!(
                    "{bytes:>12}  {count:>12}  {dtype:>8}  {op:>6}  {:>6}  {:>7.2}  {:>6.2}  {:>6.2}  {:>5}  {:>7.2}  {:>6.2}  {:>6.2}  {:>5}  {:>8}{link_use}",
                    -1,
                    out_of_place.time_us,
                    out_of_place.algbw_gb_s,
                    out_of_place.busbw_gb_s,
                    out_of_place.wrong,
                    in_place.time_us,
                    in_place.algbw_gb_s,
                    in_place.busbw_gb_s,
                    in_place.wrong,
                    in_place.chunk_bytes
                )
            });
        }
        rows.push(json!({
            "size_bytes": bytes,
            "count": count,
            "algorithm": comm.algorithm_for::<T>(count).name(),
            "out_of_place": out_of_place.json(),
            "in_place": in_place.json(),
        }));
        for (placement, measured) in [
            (Placement::OutOfPlace, out_of_place),
            (Placement::InPlace, in_place),
        ] {
            if let Some(latency) = measured.latency {
                latencies.push((*bytes, placement, latency));
            }
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    // Each rank's own: the faults on its device link and what each cost it
    // (docs/fault-path.md, the AER action matrix). On stderr, as the
    // table's stdout is rank 0's alone; one write per line, so that a line
    // is not cut by rank 0's table in a shared log.
    let rank = comm.rank();
    for fault in comm.host().faults() {
        crate::output::eprint_line(&format!("# rank {rank} fault {fault}"));
    }
    for resend in comm.host().resends() {
        crate::output::eprint_line(&format!("# rank {rank} resend {resend}"));
    }
    let avg_busbw = busbw_sum / (2 * sizes.len()) as f64;
    if leader {
        if args.json {
            let mut report = json!({
                "schema_version": 1,
                "collective": "all_reduce",
                "nranks": nranks,
                "transport": comm.transport_name(),
                "path": comm.describe(),
                "datatype": dtype,
                "op": op,
                "iters": args.iters,
                "warmup_iters": args.warmup_iters,
                "check": args.check == 1,
                "init_ms": init_ms,
                "first_call_ms": first_call_ms,
                "results": rows,
                "wrong": total_wrong,
                "avg_busbw_gb_s": avg_busbw,
            });
            if let Some(links) = &host_links {
                report["host_links"] = host_links_json(links);
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!(
                "# Out of bounds values : {total_wrong} {}",
                if total_wrong == 0 { "OK" } else { "FAILED" }
            );
            println!("# Avg bus bandwidth    : {avg_busbw:.4}");
            // Faults in the timed calls cost per page: the warm-up did not
            // bring every page the calls touch in.
            if !faulting.is_empty() {
                println!(
                    "# Page faults in timed calls (all ranks, out-of-place/in-place): {}",
                    faulting.join(", ")
                );
            }
            if args.latency {
                print_latency_table(&latencies);
            }
        }
        if let Some(file) = &args.latency_plot {
            plot_latency(args, comm.transport_name(), nranks, latencies, file)?;
        }
    }
    Ok(if total_wrong > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--latency`'s table: each size's per-call distribution.
fn print_latency_table(latencies: &[(usize, Placement, Distribution)]) {
    println!("#");
    println!("# Per-call latency (us; each call the slowest rank's, timed on its own)");
    let names: Vec<&str> = PERCENTILES.iter().map(|(name, _)| *name).collect();
    println!(
        "#       size      placement   calls  {:>9}  {:>9}  {:>9}  {:>9}        max     stddev  p99.7/p50",
        names[0], names[1], names[2], names[3].replace('_', ".")
    );
    for (bytes, placement, d) in latencies {
        let [p50, p90, p99, p99_7] = d.percentiles;
        println!(
            "{bytes:>12}  {:>13}  {:>6}  {p50:>9.2}  {p90:>9.2}  {p99:>9.2}  {p99_7:>9.2}  {:>9.2}  {:>9.3}  {:>9.2}",
            placement.name(),
            d.calls,
            d.max,
            d.stddev,
            p99_7 / p50
        );
    }
}

/// `--latency-plot`: the distributions, the peer's (`--latency-peer`)
/// beside those of the same size and placement.
fn plot_latency(
    args: &Args,
    transport: &str,
    nranks: usize,
    latencies: Vec<(usize, Placement, Distribution)>,
    file: &std::path::Path,
) -> anyhow::Result<()> {
    let peer = args.latency_peer.as_deref().map(peer_calls).transpose()?;
    let rows: Vec<PlotRow> = latencies
        .into_iter()
        .map(|(size_bytes, placement, ours)| PlotRow {
            size_bytes,
            placement,
            ours,
            peer: peer.iter().flatten().find_map(|series| {
                (series.size_bytes == size_bytes && series.placement == placement)
                    .then(|| Distribution::of(&series.calls_us))
                    .flatten()
            }),
        })
        .collect();
    let title = format!(
        "all_reduce per-call latency, {nranks} ranks, {} {}, transport {transport}",
        args.datatype.name(),
        args.op.name()
    );
    let peer_name = args
        .latency_peer
        .as_ref()
        .map(|_| args.latency_peer_name.as_str());
    std::fs::write(file, latency_svg(&rows, &title, "pcieipc", peer_name))
        .with_context(|| format!("--latency-plot: writing {}", file.display()))?;
    crate::output::eprint_line(&format!("# latency plot: {}", file.display()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_start_counts_the_calls_to_within_10_percent_of_the_tail() {
        // Slow first calls, then steady at 100 with noise.
        let calls = vec![
            400.0, 300.0, 200.0, 112.0, 108.0, 100.0, 95.0, 104.0, 100.0, 99.0, 101.0, 100.0,
        ];
        let cold = ColdStart::new(calls);
        assert_eq!(cold.steady_us, 100.0);
        assert_eq!(cold.calls_to_steady, 5);
        // Steady from the first call.
        assert_eq!(ColdStart::new(vec![10.0; 8]).calls_to_steady, 1);
        // Calls faster than the tail count as steady.
        let slowing = ColdStart::new(vec![1.0, 2.0, 3.0, 4.0, 50.0, 60.0, 70.0, 80.0]);
        assert_eq!(slowing.steady_us, 80.0);
        assert_eq!(slowing.calls_to_steady, 1);
    }

    #[test]
    fn streaming_stores_parse_auto_off_and_sizes() {
        assert_eq!(parse_streaming_stores("auto"), Ok(StreamingStores::Auto));
        assert_eq!(parse_streaming_stores("off"), Ok(StreamingStores::Off));
        assert_eq!(
            parse_streaming_stores("16777216"),
            Ok(StreamingStores::From(16 << 20))
        );
        assert_eq!(
            parse_streaming_stores("32M"),
            Ok(StreamingStores::From(32 << 20))
        );
        assert!(parse_streaming_stores("sometimes").is_err());
        assert!(parse_streaming_stores("99999999999999999999G").is_err());
    }

    #[test]
    fn copy_engine_settings_parse_sizes_never_and_refuse_chunks_out_of_range() {
        assert_eq!(parse_copy_engines_from("never"), Ok(usize::MAX));
        assert_eq!(parse_copy_engines_from("0"), Ok(0));
        assert_eq!(parse_copy_engines_from("2M"), Ok(2 << 20));
        assert!(parse_copy_engines_from("always").is_err());
        assert_eq!(parse_copy_chunk("16"), Ok(16));
        assert_eq!(parse_copy_chunk("1M"), Ok(1 << 20));
        assert_eq!(parse_copy_chunk("1G"), Ok(1 << 30));
        for refused in ["15", "0", "2G", "never"] {
            assert!(parse_copy_chunk(refused).is_err(), "{refused}");
        }
    }
}
