//! `pcieipc bench`: nccl-tests' all_reduce_perf over local ranks. Without
//! `--rank` it starts `--nranks` copies of itself, one per rank, and waits for
//! them; with `--rank` it is one rank of such a job. Rank 0 prints the table (or
//! the JSON of docs/schemas/bench-v1.schema.json).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pcieipc::engine::{
    bf16, f16, AlgorithmChoice, ChunkPolicy, CommOptions, Communicator, DType, Element, ReduceOp,
    TransportKind,
};
use serde_json::json;

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
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", value_name = "0|1", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
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
    /// Transport between the ranks: shm (host memory) or pcieipc (the shared
    /// BAR2 of ivshmem-doorbell devices of /dev/pcieipc, rank r on the r-th).
    #[arg(long, default_value = "shm")]
    transport: TransportKind,
    /// all_reduce algorithm: auto (by size and rank count), ring, one-shot.
    #[arg(long, default_value = "auto")]
    algorithm: AlgorithmChoice,
    /// Chunk size in bytes instead of the chunk policy's (by link and message size).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    chunk_bytes: Option<usize>,
    /// Chunks the ring's first step may run ahead.
    #[arg(long, value_name = "CHUNKS")]
    in_flight: Option<usize>,
    /// Bytes a rank may read from its peers on the one-shot path (sets the crossover).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    one_shot_bytes: Option<usize>,
    /// Microseconds a waiting rank spins before it sleeps on the futex.
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// Instead of the sweep: rank 0 waits in one 8-byte all_reduce for peers
    /// that arrive this many milliseconds late, and reports its CPU time.
    #[arg(long, value_name = "MS")]
    late_peer_ms: Option<u64>,
    /// Bind rank r to CPU r when there are at least as many CPUs as ranks, as
    /// mpirun does; `none` (or more ranks than CPUs) leaves placement to the
    /// scheduler.
    #[arg(long, value_name = "core|none", default_value = "core", value_parser = ["core", "none"])]
    bind_to: String,
    /// Print JSON (docs/schemas/bench-v1.schema.json) instead of the table.
    #[arg(long)]
    json: bool,
    /// Run as this rank of a job started elsewhere (with --rendezvous).
    #[arg(long, requires = "rendezvous")]
    rank: Option<usize>,
    /// The job's rendezvous name (with --rank).
    #[arg(long, requires = "rank")]
    rendezvous: Option<String>,
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
    match (args.rank, args.rendezvous.clone()) {
        (Some(rank), Some(rendezvous)) => run_rank(&args, rank, &rendezvous),
        _ => launch(&args),
    }
}

/// Starts one process per rank (this executable with `--rank`), waits for all,
/// and exits with the first failing rank's status.
fn launch(args: &Args) -> anyhow::Result<ExitCode> {
    if args.nranks == 0 {
        bail!("--nranks must be at least 1");
    }
    let exe = std::env::current_exe().context("finding this executable to start the ranks")?;
    let rendezvous = format!("bench-{}", std::process::id());
    let passed: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut children = Vec::with_capacity(args.nranks);
    for rank in 0..args.nranks {
        let child = Command::new(&exe)
            .args(&passed)
            .args(["--rank", &rank.to_string(), "--rendezvous", &rendezvous])
            .spawn()
            .with_context(|| format!("starting rank {rank}"))?;
        children.push((rank, child));
    }
    let mut exit = ExitCode::SUCCESS;
    let mut failed = false;
    for (rank, mut child) in children {
        let status = child
            .wait()
            .with_context(|| format!("waiting for rank {rank}"))?;
        if !status.success() && !failed {
            failed = true;
            eprintln!("pcieipc bench: rank {rank} {status}");
            exit = ExitCode::from(status.code().map_or(2, |code| code.clamp(1, 255) as u8));
        }
    }
    Ok(exit)
}

fn options(args: &Args, rank: usize) -> CommOptions {
    let defaults = CommOptions::default();
    let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
    CommOptions {
        // Like mpirun, bind only while every rank gets a core of its own: a
        // bound rank polls without yielding, which ranks sharing a core must not.
        bind_cpu: (args.bind_to == "core" && args.nranks <= cpus).then_some(rank),
        transport: args.transport,
        algorithm: args.algorithm,
        chunk_policy: args
            .chunk_bytes
            .map_or(defaults.chunk_policy, ChunkPolicy::fixed),
        in_flight: args.in_flight.unwrap_or(defaults.in_flight),
        one_shot_read_budget: args.one_shot_bytes.unwrap_or(defaults.one_shot_read_budget),
        spin: args.spin_us.map_or(defaults.spin, Duration::from_micros),
        ..defaults
    }
}

fn run_rank(args: &Args, rank: usize, rendezvous: &str) -> anyhow::Result<ExitCode> {
    let mut comm = Communicator::init(rendezvous, rank, args.nranks, options(args, rank))
        .with_context(|| format!("rank {rank} joining {rendezvous:?}"))?;
    // The slowest rank's init time is the job's.
    let mut init_ms = [comm.init_time().as_secs_f64() * 1e3];
    comm.all_reduce_in_place(&mut init_ms, ReduceOp::Max)?;
    if let Some(late_ms) = args.late_peer_ms {
        return late_peer(&mut comm, Duration::from_millis(late_ms), args.spin_us);
    }
    match args.datatype {
        DType::F32 => sweep::<f32>(&mut comm, args, init_ms[0]),
        DType::F64 => sweep::<f64>(&mut comm, args, init_ms[0]),
        DType::F16 => sweep::<f16>(&mut comm, args, init_ms[0]),
        DType::Bf16 => sweep::<bf16>(&mut comm, args, init_ms[0]),
        DType::I32 => sweep::<i32>(&mut comm, args, init_ms[0]),
        DType::I64 => sweep::<i64>(&mut comm, args, init_ms[0]),
        DType::U8 => sweep::<u8>(&mut comm, args, init_ms[0]),
    }
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
fn late_peer(
    comm: &mut Communicator,
    late: Duration,
    spin_us: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let mut value = [1.0f64];
    if comm.rank() != 0 {
        std::thread::sleep(late);
    }
    let cpu_before = thread_cpu_time()?;
    let started = Instant::now();
    comm.all_reduce_in_place(&mut value, ReduceOp::Sum)?;
    let (wall, cpu) = (started.elapsed(), thread_cpu_time()? - cpu_before);
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
trait BenchElement: Element {
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
    /// The chunk size the last call of this size moved in (0: one-shot).
    chunk_bytes: u32,
}

impl Measurement {
    fn json(&self) -> serde_json::Value {
        json!({
            "time_us": self.time_us,
            "algbw_gb_s": self.algbw_gb_s,
            "busbw_gb_s": self.busbw_gb_s,
            "wrong": self.wrong,
            "chunk_bytes": self.chunk_bytes,
        })
    }
}

fn measure<T: BenchElement>(
    comm: &mut Communicator,
    args: &Args,
    count: usize,
    in_place: bool,
    expected: Option<&[T]>,
) -> anyhow::Result<Measurement> {
    let (rank, nranks, op) = (comm.rank(), comm.nranks(), args.op);
    let input: Vec<T> = (0..count).map(|index| pattern(rank, index, op)).collect();
    let mut output = input.clone();
    let call = |comm: &mut Communicator, output: &mut Vec<T>| {
        if in_place {
            comm.all_reduce_in_place(output, op)
        } else {
            comm.all_reduce(&input, output, op)
        }
    };
    let mut wrong = [0i64];
    if let Some(expected) = expected {
        call(comm, &mut output)?;
        wrong[0] = output
            .iter()
            .zip(expected)
            .filter(|(got, want)| got != want)
            .count() as i64;
        comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
    }
    for _ in 0..args.warmup_iters {
        call(comm, &mut output)?;
    }
    let started = Instant::now();
    for _ in 0..args.iters {
        call(comm, &mut output)?;
    }
    let chunk_bytes = comm.last_call().map_or(0, |call| call.chunk_bytes);
    // nccl-tests reports the time averaged over ranks.
    let mut seconds = [started.elapsed().as_secs_f64() / args.iters.max(1) as f64];
    comm.all_reduce_in_place(&mut seconds, ReduceOp::Avg)?;
    let bytes = (count * std::mem::size_of::<T>()) as f64;
    let algbw = bytes / seconds[0] / 1e9;
    Ok(Measurement {
        time_us: seconds[0] * 1e6,
        algbw_gb_s: algbw,
        busbw_gb_s: algbw * 2.0 * (nranks as f64 - 1.0) / nranks as f64,
        wrong: wrong[0] as u64,
        chunk_bytes,
    })
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

fn sweep<T: BenchElement>(
    comm: &mut Communicator,
    args: &Args,
    init_ms: f64,
) -> anyhow::Result<ExitCode> {
    let leader = comm.rank() == 0;
    let nranks = comm.nranks();
    let element_bytes = std::mem::size_of::<T>();
    let sizes = sizes(args, element_bytes);
    let dtype = T::DTYPE.name();
    let op = args.op.name();
    if leader && !args.json {
        println!(
            "# pcieipc bench: all_reduce, {nranks} ranks, transport {}, algorithm {}, chunks {}, init {init_ms:.2} ms (slowest rank)",
            comm.transport_kind().name(),
            match args.algorithm {
                AlgorithmChoice::Auto => "auto".to_owned(),
                AlgorithmChoice::Fixed(algorithm) => algorithm.name().to_owned(),
            },
            args.chunk_bytes
                .map_or("by link and size".to_owned(), |bytes| format!("{bytes} B"))
        );
        println!("#");
        println!("#                                                              out-of-place                       in-place          ");
        println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong     chunk");
        println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)              (B)");
    }
    let progress = if leader && sizes.len() > 1 {
        indicatif::ProgressBar::new(sizes.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} sizes {msg}")
            .expect("static progress template"),
    );
    let mut rows = Vec::with_capacity(sizes.len());
    let mut total_wrong = 0;
    let mut busbw_sum = 0.0;
    for bytes in &sizes {
        let count = bytes / element_bytes;
        progress.set_message(format!("{bytes} B"));
        let reference = (args.check == 1).then(|| expected::<T>(nranks, count, args.op));
        let out_of_place = measure::<T>(comm, args, count, false, reference.as_deref())?;
        let in_place = measure::<T>(comm, args, count, true, reference.as_deref())?;
        total_wrong += out_of_place.wrong + in_place.wrong;
        busbw_sum += out_of_place.busbw_gb_s + in_place.busbw_gb_s;
        if leader && !args.json {
            progress.suspend(|| {
                println!(
                    "{bytes:>12}  {count:>12}  {dtype:>8}  {op:>6}  {:>6}  {:>7.2}  {:>6.2}  {:>6.2}  {:>5}  {:>7.2}  {:>6.2}  {:>6.2}  {:>5}  {:>8}",
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
        progress.inc(1);
    }
    progress.finish_and_clear();
    let avg_busbw = busbw_sum / (2 * sizes.len()) as f64;
    if leader {
        if args.json {
            let report = json!({
                "schema_version": 1,
                "collective": "all_reduce",
                "nranks": nranks,
                "transport": comm.transport_kind().name(),
                "datatype": dtype,
                "op": op,
                "iters": args.iters,
                "warmup_iters": args.warmup_iters,
                "check": args.check == 1,
                "init_ms": init_ms,
                "results": rows,
                "wrong": total_wrong,
                "avg_busbw_gb_s": avg_busbw,
            });
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!(
                "# Out of bounds values : {total_wrong} {}",
                if total_wrong == 0 { "OK" } else { "FAILED" }
            );
            println!("# Avg bus bandwidth    : {avg_busbw:.4}");
        }
    }
    Ok(if total_wrong > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
