//! Collectives of device memory through host memory: the call's input
//! copied to the host, the control plane's collective of the same kind, the
//! result copied back. The host-staged all_reduce (no peer-to-peer), and on
//! the host hand-off the calls its GPU steps do not cover (reduce_scatter,
//! all_gather, broadcast).

use crate::engine::cuda::call::GpuCall;
use crate::engine::cuda::error::on_rank;
use crate::engine::cuda::gpu::Gpu;
use crate::engine::{CallKind, Communicator, Element, EngineError};

/// Runs `call` on `gpu` through host memory and `control`; done when it
/// returns (the copies wait for the GPU's own stream, which the caller has
/// ordered after the call's stream).
pub(super) fn run(
    gpu: &Gpu,
    control: &mut Communicator,
    call: &GpuCall,
) -> Result<(), EngineError> {
    crate::with_element!(call.dtype, T => staged::<T>(gpu, control, call))
}

fn staged<T: Element + Default>(
    gpu: &Gpu,
    control: &mut Communicator,
    call: &GpuCall,
) -> Result<(), EngineError> {
    let (rank, nranks) = (control.rank(), control.nranks());
    let err = on_rank(rank);
    let (inputs, outputs) = match call.kind {
        CallKind::ReduceScatter => (nranks * call.count, call.count),
        CallKind::AllGather => (call.count, nranks * call.count),
        CallKind::AllReduce | CallKind::Broadcast => (call.count, call.count),
    };
    let mut input = vec![T::default(); inputs];
    // A broadcast's other ranks send nothing.
    if call.kind != CallKind::Broadcast || rank == call.root {
        // SAFETY: the call's promise (`GpuCall`): `input` holds what the
        // call reads, alive until the call has run, which it has when this
        // returns.
        unsafe { gpu.download(call.input, &mut input) }.map_err(&err)?;
    }
    let output = match call.kind {
        CallKind::AllReduce => {
            control.all_reduce_in_place(&mut input, call.op)?;
            input
        }
        CallKind::Broadcast => {
            control.broadcast(&mut input, call.root)?;
            input
        }
        CallKind::ReduceScatter => {
            let mut output = vec![T::default(); outputs];
            control.reduce_scatter(&input, &mut output, call.op)?;
            output
        }
        CallKind::AllGather => {
            let mut output = vec![T::default(); outputs];
            control.all_gather(&input, &mut output)?;
            output
        }
    };
    // SAFETY: as above, for what the call writes.
    unsafe { gpu.upload(call.output, &output) }.map_err(&err)
}
