//! Element types, reduction operators and the reduce loops.
//!
//! The loops take the operator outside the element loop so that each inner loop
//! is a plain element-wise map the compiler vectorises; integer arithmetic wraps
//! (as NCCL's does) so every rank and the reference agree bit for bit.

use std::fmt;
use std::str::FromStr;

pub use half::{bf16, f16};

/// Runs `$body` with `$T` the Rust element type of the `DType` value
/// `$dtype`: the one place a run-time element type becomes a compile-time
/// one (the CLI's bench and the Python binding use it).
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::engine::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::engine::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::engine::DType::F16 => {
                type $T = $crate::engine::f16;
                $body
            }
            $crate::engine::DType::Bf16 => {
                type $T = $crate::engine::bf16;
                $body
            }
            $crate::engine::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::engine::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::engine::DType::U8 => {
                type $T = u8;
                $body
            }
        }
    };
}

/// The element type of a collective's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    F32 = 1,
    F64 = 2,
    F16 = 3,
    Bf16 = 4,
    I32 = 5,
    I64 = 6,
    U8 = 7,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::Bf16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::Bf16 => 2,
            DType::U8 => 1,
        }
    }

    /// The name nccl-tests prints for this type.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F64 => "double",
            DType::F16 => "half",
            DType::Bf16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        }
    }

    pub(crate) fn from_wire(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|dtype| *dtype as u8 == code)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is neither an nccl-tests type name nor a Rust one.
#[derive(Debug, thiserror::Error)]
#[error("unknown data type {0:?} (float, double, half, bfloat16, int32, int64, uint8)")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(name: &str) -> Result<DType, UnknownDType> {
        Ok(match name {
            "float" | "f32" | "float32" => DType::F32,
            "double" | "f64" | "float64" => DType::F64,
            "half" | "f16" | "float16" => DType::F16,
            "bfloat16" | "bf16" => DType::Bf16,
            "int32" | "int" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            "uint8" | "u8" => DType::U8,
            _ => return Err(UnknownDType(name.to_owned())),
        })
    }
}

/// The reduction a collective applies across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 1,
    Prod = 2,
    Min = 3,
    Max = 4,
    /// Sum divided by the rank count (integer division for integer types).
    Avg = 5,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    pub(crate) fn from_wire(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|op| *op as u8 == code)
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of the reduction operators.
#[derive(Debug, thiserror::Error)]
#[error("unknown reduction {0:?} (sum, prod, min, max, avg)")]
pub struct UnknownReduceOp(pub String);

impl FromStr for ReduceOp {
    type Err = UnknownReduceOp;
    fn from_str(name: &str) -> Result<ReduceOp, UnknownReduceOp> {
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name() == name)
            .ok_or_else(|| UnknownReduceOp(name.to_owned()))
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type the engine can reduce: one per [`DType`]. Sealed because the
/// engine reinterprets shared-memory bytes as these types, which is sound only
/// for plain types whose every bit pattern is a valid value.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static + sealed::Sealed {
    const DTYPE: DType;
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    /// `self / nranks`, the last step of [`ReduceOp::Avg`].
    fn div_by_ranks(self, nranks: usize) -> Self;

    /// The engine's slice reduction (see `combine`). A type whose scalar
    /// arithmetic goes through a slow conversion overrides it with a blocked
    /// one; the results must equal the scalar methods' bit for bit.
    #[doc(hidden)]
    fn combine_slice(op: ReduceOp, dst: &mut [Self], peer: &[Self], own: Option<&[Self]>) {
        combine_vectorised(op, dst, peer, own)
    }
}

macro_rules! float_element {
    ($ty:ty, $dtype:expr) => {
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = $dtype;
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                a.min(b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                a.max(b)
            }
            #[inline(always)]
            fn div_by_ranks(self, nranks: usize) -> Self {
                self / nranks as $ty
            }
        }
    };
}

float_element!(f32, DType::F32);
float_element!(f64, DType::F64);

// f16 and bf16 are reduced through f32, as GPUs do, and rounded back after every
// step.
macro_rules! half_element {
    ($ty:ty, $dtype:expr $(, $combine_slice:item)?) => {
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = $dtype;
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                <$ty>::from_f32(a.to_f32() + b.to_f32())
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                <$ty>::from_f32(a.to_f32() * b.to_f32())
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                <$ty>::from_f32(a.to_f32().min(b.to_f32()))
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                <$ty>::from_f32(a.to_f32().max(b.to_f32()))
            }
            #[inline(always)]
            fn div_by_ranks(self, nranks: usize) -> Self {
                <$ty>::from_f32(self.to_f32() / nranks as f32)
            }
            $($combine_slice)?
        }
    };
}

// f16 ↔ f32 is a table-free but branchy conversion per element; half's slice
// conversions use the F16C instructions when the CPU has them, so f16 is
// reduced in blocks converted to f32 (with the same rounding as `sum` & co).
half_element!(
    f16,
    DType::F16,
    fn combine_slice(op: ReduceOp, dst: &mut [f16], peer: &[f16], own: Option<&[f16]>) {
        use half::slice::HalfFloatSliceExt;
        const BLOCK: usize = 512;
        let (mut peer_f32, mut acc_f32) = ([0f32; BLOCK], [0f32; BLOCK]);
        for start in (0..dst.len()).step_by(BLOCK) {
            let end = (start + BLOCK).min(dst.len());
            let (peer_block, acc_block) =
                (&mut peer_f32[..end - start], &mut acc_f32[..end - start]);
            peer[start..end].convert_to_f32_slice(peer_block);
            match own {
                Some(own) => own[start..end].convert_to_f32_slice(acc_block),
                None => dst[start..end].convert_to_f32_slice(acc_block),
            }
            combine_vectorised(op, acc_block, peer_block, None);
            dst[start..end].convert_from_f32_slice(acc_block);
        }
    }
);
half_element!(bf16, DType::Bf16);

macro_rules! int_element {
    ($ty:ty, $dtype:expr) => {
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = $dtype;
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn div_by_ranks(self, nranks: usize) -> Self {
                self / nranks as $ty
            }
        }
    };
}

int_element!(i32, DType::I32);
int_element!(i64, DType::I64);
int_element!(u8, DType::U8);

#[inline(always)]
fn combine_with<T: Element>(dst: &mut [T], peer: &[T], own: Option<&[T]>, f: impl Fn(T, T) -> T) {
    match own {
        Some(own) => {
            for ((d, p), o) in dst.iter_mut().zip(peer).zip(own) {
                *d = f(*p, *o);
            }
        }
        None => {
            for (d, p) in dst.iter_mut().zip(peer) {
                *d = f(*p, *d);
            }
        }
    }
}

/// `dst = peer (op) own`, or `dst = peer (op) dst` when `own` is `None` (the
/// in-place case, where the rank's own contribution already sits in `dst`).
/// [`ReduceOp::Avg`] sums here; [`finish_avg`] divides once at the end.
pub(crate) fn combine<T: Element>(op: ReduceOp, dst: &mut [T], peer: &[T], own: Option<&[T]>) {
    T::combine_slice(op, dst, peer, own)
}

/// `combine` by plain element-wise loops. The same loop is compiled twice and picked at run time: for AVX2, and for
/// the baseline x86-64 (SSE2) the crate is built for. Data a peer has just
/// written sits in the cache, where the vector width, not memory, bounds the
/// loop. (An AVX-512F-only build of the float min/max loops trips an LLVM
/// instruction-selection bug, and 256-bit vectors already match the cache's
/// load width.)
fn combine_vectorised<T: Element>(op: ReduceOp, dst: &mut [T], peer: &[T], own: Option<&[T]>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { combine_avx2(op, dst, peer, own) };
        }
    }
    combine_baseline(op, dst, peer, own)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn combine_avx2<T: Element>(op: ReduceOp, dst: &mut [T], peer: &[T], own: Option<&[T]>) {
    combine_baseline(op, dst, peer, own)
}

#[inline(always)]
fn combine_baseline<T: Element>(op: ReduceOp, dst: &mut [T], peer: &[T], own: Option<&[T]>) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => combine_with(dst, peer, own, T::sum),
        ReduceOp::Prod => combine_with(dst, peer, own, T::prod),
        ReduceOp::Min => combine_with(dst, peer, own, T::min),
        ReduceOp::Max => combine_with(dst, peer, own, T::max),
    }
}

/// `values` as their bytes, for copies that fill them from elsewhere.
pub(crate) fn bytes_of_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: every `Element` is a plain number with no padding, and any
    // bit pattern is one, so its bytes may be written freely.
    unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(values),
        )
    }
}

/// A scratch block of 8-byte words as elements of `T` (as many as fit).
pub(crate) fn elements_of_words<T: Element>(words: &mut [u64]) -> &mut [T] {
    let len = std::mem::size_of_val(words) / std::mem::size_of::<T>();
    // SAFETY: the words are 8-byte aligned, no `Element` is larger or more
    // aligned than 8 bytes, any bit pattern is a valid `Element`, and `len`
    // of them fit in the words' bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len) }
}

/// Divides a fully summed [`ReduceOp::Avg`] result by the rank count.
pub(crate) fn finish_avg<T: Element>(values: &mut [T], nranks: usize) {
    for value in values {
        *value = value.div_by_ranks(nranks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked f16 path must round exactly like the scalar methods the
    /// one-shot reference and the other ranks' arithmetic are defined by.
    #[test]
    fn blocked_f16_reduction_matches_the_scalar_methods() {
        let values = |seed: u32| -> Vec<f16> {
            (0..1500u32)
                .map(|i| f16::from_f32(((i * 7919 + seed * 104729) % 2001) as f32 / 97.0 - 10.0))
                .collect()
        };
        let (peer, own) = (values(1), values(2));
        for op in ReduceOp::ALL {
            let scalar = |a: f16, b: f16| match op {
                ReduceOp::Sum | ReduceOp::Avg => f16::sum(a, b),
                ReduceOp::Prod => f16::prod(a, b),
                ReduceOp::Min => f16::min(a, b),
                ReduceOp::Max => f16::max(a, b),
            };
            let expected: Vec<f16> = peer.iter().zip(&own).map(|(p, o)| scalar(*p, *o)).collect();
            let mut out_of_place = vec![f16::ZERO; peer.len()];
            combine(op, &mut out_of_place, &peer, Some(&own));
            let mut in_place = own.clone();
            combine(op, &mut in_place, &peer, None);
            for (got, want) in [(&out_of_place, &expected), (&in_place, &expected)] {
                let bits = |v: &Vec<f16>| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
                assert_eq!(bits(got), bits(want), "{op}");
            }
        }
    }

    #[test]
    fn integer_reductions_wrap_and_avg_truncates() {
        let mut dst = [0u8; 3];
        combine(ReduceOp::Sum, &mut dst, &[200, 1, 7], Some(&[100, 2, 8]));
        assert_eq!(dst, [44, 3, 15]);
        combine(ReduceOp::Prod, &mut dst, &[16, 3, 2], Some(&[16, 5, 3]));
        assert_eq!(dst, [0, 15, 6]);
        let mut sums = [7i32, -7];
        finish_avg(&mut sums, 2);
        assert_eq!(sums, [3, -3]);
    }
}
