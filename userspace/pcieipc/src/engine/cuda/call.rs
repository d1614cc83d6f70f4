//! One collective call of device memory, as the communicator's one entry
//! (`CudaCommunicator::queue`, and `run` that also waits) takes it: which
//! collective, of which element type and reduction, over which memory, on
//! which stream. Built from typed `DeviceBuffer`s, whose GPUs and lengths
//! the communicator checks before anything moves, or, unsafely, from raw
//! device addresses (a tensor's, say).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::gpu::Gpu;
use super::memory::DeviceBuffer;
use crate::engine::{Algorithm, CallDescriptor, CallKind, DType, Element, EngineError, ReduceOp};

/// One collective call of device memory. `count` is the elements of a
/// rank's part as [`CallDescriptor::count`] counts them: the whole buffer
/// for all_reduce and broadcast, the output of reduce_scatter, the input of
/// all_gather.
pub struct GpuCall<'a> {
    pub(super) kind: CallKind,
    pub(super) dtype: DType,
    /// `Sum` for the calls that do not reduce.
    pub(super) op: ReduceOp,
    pub(super) count: usize,
    pub(super) input: u64,
    /// The same as `input` in place (broadcast's buffer too).
    pub(super) output: u64,
    pub(super) root: usize,
    /// `None`: the GPU's own stream.
    pub(super) stream: Option<&'a Arc<CudaStream>>,
    /// What the typed constructors know of their buffers; `None` from raw
    /// addresses (the caller's promise stands for it).
    buffers: Option<Buffers<'a>>,
}

/// Whether calls of `kind` reduce (and so take an operator).
fn reduces(kind: CallKind) -> bool {
    matches!(kind, CallKind::AllReduce | CallKind::ReduceScatter)
}

/// The typed buffers of a call: their GPUs and lengths in elements.
struct Buffers<'a> {
    input_gpu: &'a Arc<Gpu>,
    output_gpu: &'a Arc<Gpu>,
    input_len: usize,
    output_len: usize,
}

impl<'a> GpuCall<'a> {
    fn typed<T: Element>(
        kind: CallKind,
        op: ReduceOp,
        count: usize,
        input: &'a DeviceBuffer<T>,
        output: &'a DeviceBuffer<T>,
    ) -> Self {
        // SAFETY: the buffers live for 'a, and `check` refuses lengths
        // that do not hold what `kind` reads and writes before anything
        // moves.
        let call = unsafe {
            GpuCall::from_raw(
                kind,
                T::DTYPE,
                op,
                count,
                input.address(),
                output.address(),
                0,
            )
        };
        GpuCall {
            buffers: Some(Buffers {
                input_gpu: input.gpu(),
                output_gpu: output.gpu(),
                input_len: input.len(),
                output_len: output.len(),
            }),
            ..call
        }
    }

    /// `output[i]` = `op` over all ranks' `input[i]`.
    pub fn all_reduce<T: Element>(
        input: &'a DeviceBuffer<T>,
        output: &'a mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Self {
        GpuCall::typed(CallKind::AllReduce, op, input.len(), input, output)
    }

    /// `buffer[i]` = `op` over all ranks' `buffer[i]`.
    pub fn all_reduce_in_place<T: Element>(buffer: &'a mut DeviceBuffer<T>, op: ReduceOp) -> Self {
        let buffer = &*buffer;
        GpuCall::typed(CallKind::AllReduce, op, buffer.len(), buffer, buffer)
    }

    /// Rank r's `output` = `op` over all ranks' `input[r·m..(r+1)·m]`
    /// (m = `output.len()`, `input.len()` = N·m).
    pub fn reduce_scatter<T: Element>(
        input: &'a DeviceBuffer<T>,
        output: &'a mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Self {
        GpuCall::typed(CallKind::ReduceScatter, op, output.len(), input, output)
    }

    /// `output[r·m..(r+1)·m]` = rank r's `input` (m = `input.len()`,
    /// `output.len()` = N·m). In place (`input` this rank's part of
    /// `output`) only through [`from_raw`](Self::from_raw).
    pub fn all_gather<T: Element>(
        input: &'a DeviceBuffer<T>,
        output: &'a mut DeviceBuffer<T>,
    ) -> Self {
        GpuCall::typed(
            CallKind::AllGather,
            ReduceOp::Sum,
            input.len(),
            input,
            output,
        )
    }

    /// Every rank's `buffer` = rank `root`'s.
    pub fn broadcast<T: Element>(buffer: &'a mut DeviceBuffer<T>, root: usize) -> Self {
        let buffer = &*buffer;
        GpuCall {
            root,
            ..GpuCall::typed(
                CallKind::Broadcast,
                ReduceOp::Sum,
                buffer.len(),
                buffer,
                buffer,
            )
        }
    }

    /// The call `kind` of `count` elements of `dtype` (counted as for the
    /// typed constructors) at device addresses: `input` and `output` are
    /// the same in place and for broadcast; for all_gather, `input` may be
    /// this rank's part of `output`. `op` counts only for the reducing
    /// calls, `root` only for broadcast.
    ///
    /// # Safety
    ///
    /// `input` and `output` are device addresses of the communicator's GPU
    /// holding what `kind` reads and writes (`count` elements of `dtype`,
    /// N·`count` for reduce_scatter's input and all_gather's output), not
    /// overlapping otherwise, and alive until the call's stream has run it.
    pub unsafe fn from_raw(
        kind: CallKind,
        dtype: DType,
        op: ReduceOp,
        count: usize,
        input: u64,
        output: u64,
        root: usize,
    ) -> Self {
        GpuCall {
            kind,
            dtype,
            op: if reduces(kind) { op } else { ReduceOp::Sum },
            count,
            input,
            output,
            root,
            stream: None,
            buffers: None,
        }
    }

    /// The call ordered on `stream` (of the communicator's GPU: a caller's
    /// own, or one borrowed from another library) instead of the GPU's own.
    pub fn on_stream(self, stream: &'a Arc<CudaStream>) -> Self {
        GpuCall {
            stream: Some(stream),
            ..self
        }
    }

    /// The call's stream: its own, or `gpu`'s.
    pub(super) fn stream_of<'s>(&'s self, gpu: &'s Arc<Gpu>) -> &'s Arc<CudaStream> {
        self.stream.unwrap_or_else(|| gpu.stream())
    }

    pub(super) fn bytes(&self) -> usize {
        self.count * self.dtype.size_bytes()
    }

    /// The call as ranks agree on it, moved by `algorithm` in chunks of
    /// `chunk_bytes` (0 where it moves in one piece).
    pub(super) fn descriptor(&self, algorithm: Algorithm, chunk_bytes: u32) -> CallDescriptor {
        CallDescriptor {
            kind: self.kind,
            dtype: self.dtype,
            op: reduces(self.kind).then_some(self.op),
            count: self.count as u64,
            root: self.root as u32,
            algorithm,
            chunk_bytes,
            bypass_slots: false,
        }
    }

    /// Refuses, before anything moves, a root out of range, and typed
    /// buffers of another GPU than `gpu` or of lengths that do not fit the
    /// call among `nranks` ranks.
    pub(super) fn check(
        &self,
        gpu: &Arc<Gpu>,
        rank: usize,
        nranks: usize,
    ) -> Result<(), EngineError> {
        if self.kind == CallKind::Broadcast && self.root >= nranks {
            return Err(EngineError::RootOutOfRange {
                root: self.root,
                nranks,
            });
        }
        let Some(buffers) = &self.buffers else {
            return Ok(());
        };
        match self.kind {
            CallKind::AllReduce => EngineError::check_length(
                "all_reduce output",
                buffers.output_len,
                buffers.input_len,
            )?,
            CallKind::ReduceScatter => EngineError::check_length(
                "reduce_scatter input",
                buffers.input_len,
                nranks * buffers.output_len,
            )?,
            CallKind::AllGather => EngineError::check_length(
                "all_gather output",
                buffers.output_len,
                nranks * buffers.input_len,
            )?,
            CallKind::Broadcast => {}
        }
        for buffer_gpu in [buffers.input_gpu, buffers.output_gpu] {
            if !Arc::ptr_eq(buffer_gpu, gpu) {
                return Err(EngineError::WrongGpu {
                    rank,
                    buffer_gpu: buffer_gpu.ordinal(),
                    gpu: gpu.ordinal(),
                });
            }
        }
        Ok(())
    }
}
