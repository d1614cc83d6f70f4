//! The reduce kernels, one NVRTC module per (element type, reduction),
//! loaded when a communicator first needs that pair (from the kernel store
//! when an earlier process compiled it: `nvrtc`) and kept for the process's
//! lifetime.
//!
//! Arithmetic follows the CPU engine (`engine::dtype`) so results match it:
//! f16 and bf16 are widened to f32 and rounded back after every step, integer
//! sums and products wrap, avg is the reduced value divided by the rank count.
//! No CUDA headers are included (NVRTC installs do not always ship
//! cuda_fp16.h): half conversions are one PTX instruction or bit operations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
};

use super::error::{driver_error, CudaError};
use super::nvrtc;
use crate::engine::{DType, ReduceOp};

/// Ranks the hand-off kernels serve (their exchange argument has a slot per
/// rank).
pub(crate) const HANDOFF_MAX_RANKS: usize = 8;

/// The most sources the one-shot kernel reduces: it takes one pointer
/// argument per rank.
pub(crate) const ONE_SHOT_MAX_RANKS: usize = 8;

const THREADS_PER_BLOCK: u32 = 256;

/// The kernels' CUDA C: reduce kernels, then the GPU hand-off's.
const COMMON: &str = include_str!("kernels/common.cu");

/// The reduce-scatter, all-gather and broadcast kernels of the GPU hand-off
/// (appended to COMMON's hand-off section).
const HANDOFF_COLLECTIVES: &str = include_str!("kernels/handoff_collectives.cu");

/// The kernels between the copy engines' copies of an all_reduce through
/// host memory (appended after HANDOFF_COLLECTIVES).
const HANDOFF_COPIES: &str = include_str!("kernels/handoff_copies.cu");

/// The `#define`s that specialise COMMON for one element type and reduction.
fn specialisation(dtype: DType, op: ReduceOp) -> String {
    // (storage, compute, unsigned twin for wrapping, load, store, float min/max)
    let (storage, compute, wrap, load, store, fmin, fmax) = match dtype {
        DType::F32 => ("float", "float", "", "(x)", "(c)", "fminf", "fmaxf"),
        DType::F64 => ("double", "double", "", "(x)", "(c)", "fmin", "fmax"),
        DType::F16 => ("h16", "float", "", "up(x)", "down_h16(c)", "fminf", "fmaxf"),
        DType::Bf16 => ("b16", "float", "", "up(x)", "down_b16(c)", "fminf", "fmaxf"),
        DType::I32 => ("int", "int", "unsigned", "(x)", "(c)", "", ""),
        DType::I64 => (
            "long long",
            "long long",
            "unsigned long long",
            "(x)",
            "(c)",
            "",
            "",
        ),
        DType::U8 => (
            "unsigned char",
            "unsigned",
            "unsigned",
            "(x)",
            "((unsigned char)(c))",
            "",
            "",
        ),
    };
    let integer = !wrap.is_empty();
    let operation = match (op, integer) {
        (ReduceOp::Sum | ReduceOp::Avg, false) => "((a) + (b))".to_owned(),
        (ReduceOp::Sum | ReduceOp::Avg, true) => format!("((C)(({wrap})(a) + ({wrap})(b)))"),
        (ReduceOp::Prod, false) => "((a) * (b))".to_owned(),
        (ReduceOp::Prod, true) => format!("((C)(({wrap})(a) * ({wrap})(b)))"),
        (ReduceOp::Min, false) => format!("{fmin}((a), (b))"),
        (ReduceOp::Max, false) => format!("{fmax}((a), (b))"),
        (ReduceOp::Min, true) => "((a) < (b) ? (a) : (b))".to_owned(),
        (ReduceOp::Max, true) => "((a) > (b) ? (a) : (b))".to_owned(),
    };
    format!(
        "#define S {storage}\n#define C {compute}\n#define LD(x) {load}\n#define ST(c) {store}\n\
         #define OP(a, b) {operation}\n#define DIV(c, d) ((c) / (C)(d))\n"
    )
}

/// Blocks of a hand-off launch, at most (`HBLOCKS`: the flags are per block).
pub(crate) const HANDOFF_BLOCKS: usize = 64;
/// Bytes of the flags and the calls they carry at the start of an exchange
/// block (`HEADER_BYTES`).
pub(crate) const HANDOFF_HEADER_BYTES: usize = 2 * 2 * HANDOFF_MAX_RANKS * HANDOFF_BLOCKS * 8 * 3;
const HANDOFF_THREADS: u32 = 512;

/// `struct Segments` of the hand-off kernels, passed by value: where each
/// rank's segment of a two-shot launch starts, in elements, then the
/// launch's element count (rank r's segment is `start[r]..start[r + 1]`).
/// The bounds come from `schedule` (the GPU hand-off's plan); the kernels
/// compute none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SegmentsArg {
    pub(crate) start: [u64; HANDOFF_MAX_RANKS + 1],
}

// SAFETY: `repr(C)` plain data laid out as the kernels' `struct Segments`
// (HMAX + 1 u64s, no padding).
unsafe impl DeviceRepr for SegmentsArg {}

/// `struct Exchange` of the hand-off kernels, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ExchangeArg {
    pub(crate) base: [u64; HANDOFF_MAX_RANKS],
    pub(crate) window: u64,
    pub(crate) rank: u32,
    pub(crate) nranks: u32,
    pub(crate) timeout_ns: u64,
    pub(crate) error: u64,
    /// `HANDOFF_BLOCKS` launch counters in this rank's device memory, then
    /// the epoch of the last copy-engine launch's end.
    pub(crate) epochs: u64,
    /// This call's descriptor (`CallDescriptor::to_words`, chunk left out),
    /// which every signal carries to the peer and every wait checks.
    pub(crate) call: [u64; 2],
    /// Where a kernel that met another call writes both (host-mapped).
    pub(crate) calls: u64,
    /// Where the call's last kernel stamps the GPU's time as it ends
    /// (device memory, `gpu_handoff::CallEnds`), or 0: no stamp.
    pub(crate) call_end: u64,
}

// SAFETY: `repr(C)` plain data laid out as the kernels' `struct Exchange`
// (u64s, then two u32s filling one 8-byte slot, then u64s: no padding).
unsafe impl DeviceRepr for ExchangeArg {}

/// The copy hand-off's flag kernels (`handoff_copies.cu`), one thread each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyFlag {
    /// Raise a flag at every peer once the copies before it have landed.
    Signal,
    /// Wait (bounded) until every peer raised a flag here.
    Await,
    /// Raise the launch's meeting flag at every peer and wait for theirs
    /// (phase 0 at its start, 1 at its end, which moves the counters on).
    Meet,
}

/// Which hand-off kernel a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandoffKernel {
    OneShot,
    TwoShot,
    ReduceScatter,
    AllGather,
    Broadcast,
}

/// One hand-off launch: `elements` elements from `src` into `dst`; `stride`
/// elements between ranks' segments (reduce-scatter's input, all-gather's
/// output); the two-shot kernel's segments; `divide_by` for avg (else 0);
/// the broadcast's root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HandoffLaunch {
    pub(crate) kernel: HandoffKernel,
    pub(crate) dst: u64,
    pub(crate) src: u64,
    pub(crate) elements: usize,
    pub(crate) stride: usize,
    pub(crate) segments: SegmentsArg,
    pub(crate) divide_by: u32,
    pub(crate) root: u32,
}

/// One kernel of a module, looked up at its first launch: under the
/// driver's lazy loading (the default since CUDA 12.2) the lookup loads it
/// onto the GPU, and a job's calls use a few of a module's eleven.
/// Looking up all seven a module then held took 0.13 to 0.17 ms of a first
/// call of about 0.9 ms on the H200 host.
struct LazyFunction {
    name: &'static str,
    /// What failing to find it is, for the error.
    finding: &'static str,
    function: OnceLock<CudaFunction>,
}

impl LazyFunction {
    const fn new(name: &'static str, finding: &'static str) -> LazyFunction {
        LazyFunction {
            name,
            finding,
            function: OnceLock::new(),
        }
    }
}

/// The kernels of one (element type, reduction), loaded on one GPU.
pub(crate) struct Kernel {
    ordinal: usize,
    element_bytes: usize,
    multiprocessors: u32,
    module: Arc<CudaModule>,
    reduce: LazyFunction,
    one_shot: LazyFunction,
    handoff_one_shot: LazyFunction,
    handoff_two_shot: LazyFunction,
    handoff_reduce_scatter: LazyFunction,
    handoff_all_gather: LazyFunction,
    handoff_broadcast: LazyFunction,
    copies_signal: LazyFunction,
    copies_await: LazyFunction,
    copies_meet: LazyFunction,
    copies_reduce: LazyFunction,
}

/// Every (element type, reduction) compiled so far on one GPU.
#[derive(Default)]
pub(crate) struct KernelCache {
    compiled: Mutex<HashMap<(DType, ReduceOp), Arc<Kernel>>>,
}

impl KernelCache {
    /// The kernels of `dtype` and `op` in `ctx` (a GPU of `multiprocessors`
    /// multiprocessors), compiled on first use.
    pub(crate) fn get(
        &self,
        ctx: &Arc<CudaContext>,
        multiprocessors: u32,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<Arc<Kernel>, CudaError> {
        let mut compiled = self
            .compiled
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(kernel) = compiled.get(&(dtype, op)) {
            return Ok(kernel.clone());
        }
        let ordinal = ctx.ordinal();
        let driver = |what| driver_error(ordinal, what);
        let capability = ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))?;
        let source = format!(
            "{}{COMMON}{HANDOFF_COLLECTIVES}{HANDOFF_COPIES}",
            specialisation(dtype, op)
        );
        let name = format!("pcieipc_{}_{}.cu", dtype.name(), op.name());
        let ptx = nvrtc::module_image(&source, &name, capability, ordinal)?;
        let module = ctx
            .load_module(ptx)
            .map_err(driver("loading the reduce kernels"))?;
        let kernel = Arc::new(Kernel {
            ordinal,
            element_bytes: dtype.size_bytes(),
            multiprocessors,
            module,
            reduce: LazyFunction::new("reduce", "finding the reduce kernel"),
            one_shot: LazyFunction::new("one_shot", "finding the one-shot kernel"),
            handoff_one_shot: LazyFunction::new(
                "handoff_one_shot",
                "finding the hand-off one-shot kernel",
            ),
            handoff_two_shot: LazyFunction::new(
                "handoff_two_shot",
                "finding the hand-off two-shot kernel",
            ),
            handoff_reduce_scatter: LazyFunction::new(
                "handoff_reduce_scatter",
                "finding the hand-off reduce-scatter kernel",
            ),
            handoff_all_gather: LazyFunction::new(
                "handoff_all_gather",
                "finding the hand-off all-gather kernel",
            ),
            handoff_broadcast: LazyFunction::new(
                "handoff_broadcast",
                "finding the hand-off broadcast kernel",
            ),
            copies_signal: LazyFunction::new(
                "handoff_copies_signal",
                "finding the copy hand-off's signal kernel",
            ),
            copies_await: LazyFunction::new(
                "handoff_copies_await",
                "finding the copy hand-off's wait kernel",
            ),
            copies_meet: LazyFunction::new(
                "handoff_copies_meet",
                "finding the copy hand-off's meeting kernel",
            ),
            copies_reduce: LazyFunction::new(
                "handoff_copies_reduce",
                "finding the copy hand-off's reduce kernel",
            ),
        });
        compiled.insert((dtype, op), kernel.clone());
        Ok(kernel)
    }
}

impl Kernel {
    fn driver(&self, what: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        driver_error(self.ordinal, what)
    }

    /// `lazy`'s function, looked up in the module the first time.
    fn function<'a>(&self, lazy: &'a LazyFunction) -> Result<&'a CudaFunction, CudaError> {
        if let Some(function) = lazy.function.get() {
            return Ok(function);
        }
        let function = self
            .module
            .load_function(lazy.name)
            .map_err(self.driver(lazy.finding))?;
        Ok(lazy.function.get_or_init(|| function))
    }

    /// The grid of a reduce or one-shot launch over `elements` elements.
    fn launch_config(&self, elements: usize) -> LaunchConfig {
        let per_thread = (16 / self.element_bytes).max(1);
        let threads = elements.div_ceil(per_thread).max(1);
        // Enough blocks to fill every multiprocessor a few times over; the
        // kernels stride over the rest.
        let blocks = threads
            .div_ceil(THREADS_PER_BLOCK as usize)
            .min(self.multiprocessors as usize * 8)
            .max(1);
        LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Queues on `stream` `dst[i]` (and `dst2[i]`) = `a[i]` op `b[i]` for
    /// `elements` elements, divided by `divide_by` when it is not 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &self,
        stream: &CudaStream,
        dst: u64,
        dst2: Option<u64>,
        a: u64,
        b: u64,
        elements: usize,
        divide_by: u32,
    ) -> Result<(), CudaError> {
        if elements == 0 {
            return Ok(());
        }
        let (dst2, n) = (dst2.unwrap_or(0), elements as u64);
        let config = self.launch_config(elements);
        let mut launch = stream.launch_builder(self.function(&self.reduce)?);
        launch
            .arg(&dst)
            .arg(&dst2)
            .arg(&a)
            .arg(&b)
            .arg(&n)
            .arg(&divide_by);
        // SAFETY: the arguments match the kernel's signature (pointers as
        // 64-bit addresses); callers pass ranges of `elements` elements inside
        // live allocations that stay mapped until the stream drains.
        unsafe { launch.launch(config) }.map_err(self.driver("launching the reduce kernel"))?;
        Ok(())
    }

    /// Queues on `stream` `dst[i]` = op over `sources[k][i]` in rank order.
    pub(crate) fn one_shot(
        &self,
        stream: &CudaStream,
        dst: u64,
        sources: &[u64],
        elements: usize,
        divide_by: u32,
    ) -> Result<(), CudaError> {
        assert!(
            (1..=ONE_SHOT_MAX_RANKS).contains(&sources.len()),
            "the one-shot kernel takes 1 to {ONE_SHOT_MAX_RANKS} sources"
        );
        if elements == 0 {
            return Ok(());
        }
        let mut p = [0u64; ONE_SHOT_MAX_RANKS];
        p[..sources.len()].copy_from_slice(sources);
        let (nranks, n) = (sources.len() as u32, elements as u64);
        let config = self.launch_config(elements);
        let mut launch = stream.launch_builder(self.function(&self.one_shot)?);
        launch.arg(&dst);
        for source in &p {
            launch.arg(source);
        }
        launch.arg(&nranks).arg(&n).arg(&divide_by);
        // SAFETY: as in `reduce`; unused source slots are never read.
        unsafe { launch.launch(config) }.map_err(self.driver("launching the one-shot kernel"))?;
        Ok(())
    }

    /// Queues one hand-off launch on `stream`, `blocks` blocks (the same on
    /// every rank).
    pub(crate) fn handoff(
        &self,
        launch: &HandoffLaunch,
        stream: &CudaStream,
        blocks: u32,
        exchange: &ExchangeArg,
    ) -> Result<(), CudaError> {
        let function = self.function(match launch.kernel {
            HandoffKernel::OneShot => &self.handoff_one_shot,
            HandoffKernel::TwoShot => &self.handoff_two_shot,
            HandoffKernel::ReduceScatter => &self.handoff_reduce_scatter,
            HandoffKernel::AllGather => &self.handoff_all_gather,
            HandoffKernel::Broadcast => &self.handoff_broadcast,
        })?;
        let (dst, src, n, stride) = (
            launch.dst,
            launch.src,
            launch.elements as u64,
            launch.stride as u64,
        );
        let (divide_by, root) = (launch.divide_by, launch.root);
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (HANDOFF_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(function);
        builder
            .arg(&dst)
            .arg(&src)
            .arg(&n)
            .arg(&stride)
            .arg(&divide_by)
            .arg(&root)
            .arg(&launch.segments)
            .arg(exchange);
        // SAFETY: the arguments match the kernels' common signature; `dst`
        // and `src` hold what the kernel reads and writes (the caller's
        // promise: `HandoffLaunch`), and the exchange blocks, the error
        // word and the call's end stamp stay mapped while the communicator
        // lives, which drains its launches before it goes.
        unsafe { builder.launch(config) }.map_err(self.driver("launching a hand-off kernel"))?;
        Ok(())
    }

    /// Queues on `stream` one thread of the copy hand-off's `flag` kernel,
    /// for flag `slot` of `phase` (a meeting's slot is fixed: `slot` is
    /// ignored).
    pub(crate) fn copies_flag(
        &self,
        flag: CopyFlag,
        stream: &CudaStream,
        exchange: &ExchangeArg,
        phase: u32,
        slot: u32,
    ) -> Result<(), CudaError> {
        let (lazy, word) = match flag {
            CopyFlag::Signal => (&self.copies_signal, slot),
            CopyFlag::Await => (&self.copies_await, slot),
            // The meeting at the end (phase 1) is the launch's last.
            CopyFlag::Meet => (&self.copies_meet, phase),
        };
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(self.function(lazy)?);
        builder.arg(exchange).arg(&phase).arg(&word);
        // SAFETY: the arguments match the flag kernels' signature; they
        // touch only the exchange blocks, the counters, the error word and
        // the call's end stamp, which stay mapped while the communicator
        // lives (it drains its launches before it goes).
        unsafe { builder.launch(config) }
            .map_err(self.driver("launching a hand-off flag kernel"))?;
        Ok(())
    }

    /// Queues on `stream` `out[i]` = op over every rank's contribution in
    /// rank order for `elements` elements: this rank's at `mine`, peer k's
    /// at `staged + k * window` (device memory), divided by `divide_by`
    /// when it is not 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copies_reduce(
        &self,
        stream: &CudaStream,
        out: u64,
        mine: u64,
        staged: u64,
        elements: usize,
        divide_by: u32,
        exchange: &ExchangeArg,
    ) -> Result<(), CudaError> {
        if elements == 0 {
            return Ok(());
        }
        let n = elements as u64;
        // One pass of UNROLL (4) vectors per thread, at most one block a
        // multiprocessor: the data is in device memory.
        let per_block = HANDOFF_THREADS as usize * 4 * (16 / self.element_bytes).max(1);
        let blocks = elements
            .div_ceil(per_block)
            .clamp(1, self.multiprocessors as usize) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (HANDOFF_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(self.function(&self.copies_reduce)?);
        builder
            .arg(&out)
            .arg(&mine)
            .arg(&staged)
            .arg(&n)
            .arg(&divide_by)
            .arg(exchange);
        // SAFETY: the arguments match the kernel's signature; `out` and
        // `mine` hold `elements` elements of the call's buffers (the
        // caller's promise, `GpuCall`), and the staging buffer a window per
        // rank, alive while the communicator lives.
        unsafe { builder.launch(config) }
            .map_err(self.driver("launching the copy hand-off's reduce kernel"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sums_wrap_through_the_unsigned_twin() {
        let text = specialisation(DType::I32, ReduceOp::Sum);
        assert!(
            text.contains("#define OP(a, b) ((C)((unsigned)(a) + (unsigned)(b)))"),
            "{text}"
        );
        assert!(text.contains("#define S int\n"), "{text}");
    }

    #[test]
    fn half_types_compute_in_f32_and_round_back() {
        let text = specialisation(DType::Bf16, ReduceOp::Max);
        assert!(text.contains("#define C float\n"), "{text}");
        assert!(text.contains("#define ST(c) down_b16(c)\n"), "{text}");
        assert!(
            text.contains("#define OP(a, b) fmaxf((a), (b))\n"),
            "{text}"
        );
    }
}
