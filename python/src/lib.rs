//! `pcieipc._native`: the pcieipc communicator for Python (the `pcieipc`
//! package re-exports it and adds the torch.distributed backend).
//!
//! - `memory`: what callers hand over (buffer protocol, DLPack), checked.
//! - `host`: `Communicator`, collectives on host memory.
//! - `cuda`: `CudaCommunicator`, stream-ordered collectives on CUDA tensors.
//! - `errors`: the engine's errors as a hierarchy of Python exceptions.

mod cuda;
mod errors;
mod host;
mod memory;

use pyo3::prelude::*;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(module)?;
    errors::make_invalid_argument_a_value_error(module)?;
    module.add_class::<host::Communicator>()?;
    module.add_class::<cuda::CudaCommunicator>()?;
    module.add(
        "DTYPES",
        pcieipc::engine::DType::ALL.map(memory::dtype_name).to_vec(),
    )?;
    module.add(
        "OPS",
        pcieipc::engine::ReduceOp::ALL.map(|op| op.name()).to_vec(),
    )?;
    Ok(())
}
