//! The reduce kernels, one NVRTC module per (element type, reduction),
//! compiled when a communicator first needs that pair and kept for the
//! process's lifetime.
//!
//! Arithmetic follows the CPU engine (`engine::dtype`) so results match it:
//! f16 and bf16 are widened to f32 and rounded back after every step, integer
//! sums and products wrap, avg is the reduced value divided by the rank count.
//! No CUDA headers are included (NVRTC installs do not always ship
//! cuda_fp16.h): half conversions are one PTX instruction or bit operations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::gpu::{driver_error, CudaError, Gpu};
use crate::engine::{DType, ReduceOp};

/// The most sources the one-shot kernel reduces: it takes one pointer
/// argument per rank.
pub(crate) const ONE_SHOT_MAX_RANKS: usize = 8;

const THREADS_PER_BLOCK: u32 = 256;

const COMMON: &str = r#"
typedef unsigned long long u64;
struct h16 { unsigned short bits; };
struct b16 { unsigned short bits; };
__device__ __forceinline__ float up(h16 x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits)); return f; }
__device__ __forceinline__ h16 down_h16(float f) { h16 x; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x.bits) : "f"(f)); return x; }
__device__ __forceinline__ float up(b16 x) { return __uint_as_float(((unsigned)x.bits) << 16); }
// Round to nearest even, NaN kept quiet: the half crate's bf16::from_f32.
__device__ __forceinline__ b16 down_b16(float f) {
    unsigned u = __float_as_uint(f);
    b16 x;
    if ((u & 0x7fffffffu) > 0x7f800000u) { x.bits = (unsigned short)((u >> 16) | 0x40u); return x; }
    u += 0x7fffu + ((u >> 16) & 1u);
    x.bits = (unsigned short)(u >> 16);
    return x;
}
__device__ __forceinline__ S apply(S a, S b, unsigned div) {
    S r = ST(OP(LD(a), LD(b)));
    if (div) r = ST(DIV(LD(r), div));
    return r;
}
#define VEC (16 / (int)sizeof(S))

// dst[i] (and dst2[i] when dst2 is not null) = a[i] op b[i], then / div when
// div is not 0. 16-byte loads and stores when every pointer is aligned.
extern "C" __global__ void reduce(S* dst, S* dst2, const S* a, const S* b, u64 n, unsigned div) {
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    bool aligned = ((((u64)dst) | ((u64)dst2) | ((u64)a) | ((u64)b)) & 15) == 0;
    u64 nvec = aligned ? n / VEC : 0;
    for (u64 v = tid; v < nvec; v += stride) {
        uint4 va = ((const uint4*)a)[v], vb = ((const uint4*)b)[v], vr;
        const S* ea = (const S*)&va; const S* eb = (const S*)&vb; S* er = (S*)&vr;
        #pragma unroll
        for (int j = 0; j < VEC; j++) er[j] = apply(ea[j], eb[j], 0);
        if (div) {
            #pragma unroll
            for (int j = 0; j < VEC; j++) er[j] = ST(DIV(LD(er[j]), div));
        }
        ((uint4*)dst)[v] = vr;
        if (dst2) ((uint4*)dst2)[v] = vr;
    }
    for (u64 i = nvec * VEC + tid; i < n; i += stride) {
        S r = apply(a[i], b[i], div);
        dst[i] = r;
        if (dst2) dst2[i] = r;
    }
}

// dst[i] = p1[i] op p0[i], then op p2[i], ... in rank order (as the CPU
// engine's one-shot path), then / div when div is not 0.
extern "C" __global__ void one_shot(S* dst, const S* p0, const S* p1, const S* p2, const S* p3,
                                    const S* p4, const S* p5, const S* p6, const S* p7,
                                    unsigned nranks, u64 n, unsigned div) {
    const S* p[8] = {p0, p1, p2, p3, p4, p5, p6, p7};
    u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
    u64 bits = (u64)dst;
    for (unsigned k = 0; k < nranks; k++) bits |= (u64)p[k];
    u64 nvec = (bits & 15) == 0 ? n / VEC : 0;
    for (u64 v = tid; v < nvec; v += stride) {
        uint4 acc = ((const uint4*)p[0])[v];
        S* ea = (S*)&acc;
        for (unsigned k = 1; k < nranks; k++) {
            uint4 vk = ((const uint4*)p[k])[v];
            const S* ek = (const S*)&vk;
            #pragma unroll
            for (int j = 0; j < VEC; j++) ea[j] = apply(ek[j], ea[j], 0);
        }
        if (div) {
            #pragma unroll
            for (int j = 0; j < VEC; j++) ea[j] = ST(DIV(LD(ea[j]), div));
        }
        ((uint4*)dst)[v] = acc;
    }
    for (u64 i = nvec * VEC + tid; i < n; i += stride) {
        S r = p[0][i];
        for (unsigned k = 1; k < nranks; k++) r = apply(p[k][i], r, 0);
        if (div) r = ST(DIV(LD(r), div));
        dst[i] = r;
    }
}
"#;

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

/// NVRTC's virtual architecture for a compute capability it is known to
/// handle; `None` leaves NVRTC's default.
fn architecture(capability: (i32, i32)) -> Option<&'static str> {
    Some(match capability {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// The two kernels of one (element type, reduction).
pub(crate) struct Kernel {
    reduce: CudaFunction,
    one_shot: CudaFunction,
}

/// Every (element type, reduction) compiled so far on one GPU.
#[derive(Default)]
pub(crate) struct KernelCache {
    compiled: Mutex<HashMap<(DType, ReduceOp), Arc<Kernel>>>,
}

impl KernelCache {
    pub(crate) fn get(
        &self,
        ctx: &Arc<CudaContext>,
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
        let source = format!("{}{COMMON}", specialisation(dtype, op));
        let ptx = compile_ptx_with_opts(
            source,
            CompileOptions {
                arch: architecture(capability),
                name: Some(format!("pcieipc_{}_{}.cu", dtype.name(), op.name())),
                ..CompileOptions::default()
            },
        )
        .map_err(|error| CudaError::Compile {
            ordinal,
            log: error.to_string(),
        })?;
        let module = ctx
            .load_module(ptx)
            .map_err(driver("loading the reduce kernels"))?;
        let kernel = Arc::new(Kernel {
            reduce: module
                .load_function("reduce")
                .map_err(driver("finding the reduce kernel"))?,
            one_shot: module
                .load_function("one_shot")
                .map_err(driver("finding the one-shot kernel"))?,
        });
        compiled.insert((dtype, op), kernel.clone());
        Ok(kernel)
    }
}

fn launch_config(gpu: &Gpu, elements: usize, element_bytes: usize) -> LaunchConfig {
    let per_thread = (16 / element_bytes).max(1);
    let threads = elements.div_ceil(per_thread).max(1);
    // Enough blocks to fill every multiprocessor a few times over; the
    // kernels stride over the rest.
    let blocks = threads
        .div_ceil(THREADS_PER_BLOCK as usize)
        .min(gpu.multiprocessors() as usize * 8)
        .max(1);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS_PER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernel {
    /// Queues `dst[i]` (and `dst2[i]`) = `a[i]` op `b[i]` for `elements`
    /// elements, divided by `divide_by` when it is not 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &self,
        gpu: &Gpu,
        dtype: DType,
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
        let config = launch_config(gpu, elements, dtype.size_bytes());
        let stream = gpu.stream();
        let mut launch = stream.launch_builder(&self.reduce);
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
        unsafe { launch.launch(config) }.map_err(gpu.driver("launching the reduce kernel"))?;
        Ok(())
    }

    /// Queues `dst[i]` = op over `sources[k][i]` in rank order.
    pub(crate) fn one_shot(
        &self,
        gpu: &Gpu,
        dtype: DType,
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
        let config = launch_config(gpu, elements, dtype.size_bytes());
        let stream = gpu.stream();
        let mut launch = stream.launch_builder(&self.one_shot);
        launch.arg(&dst);
        for source in &p {
            launch.arg(source);
        }
        launch.arg(&nranks).arg(&n).arg(&divide_by);
        // SAFETY: as in `reduce`; unused source slots are never read.
        unsafe { launch.launch(config) }.map_err(gpu.driver("launching the one-shot kernel"))?;
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

    #[test]
    fn unknown_capabilities_leave_nvrtc_its_default() {
        assert_eq!(architecture((9, 0)), Some("compute_90"));
        assert_eq!(architecture((6, 1)), None);
    }
}
