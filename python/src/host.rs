//! `pcieipc.Communicator`: the collectives on host memory, over the engine's
//! host transports (shm, pcieipc). Calls release the interpreter lock while
//! the engine runs, so other Python threads go on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pcieipc::engine::cuda::CudaCommunicator;
use pcieipc::engine::{
    CommOptions, Communicator as EngineCommunicator, EngineError, JobSecret, ReduceOp,
    TransportOptions,
};
use pyo3::prelude::*;

use crate::errors::{invalid, to_python};
use crate::memory::{Device, Memory};

/// Whose host communicator this is: its own, or a CUDA communicator's
/// control plane (shared with that object).
enum Owner {
    Own(Box<Mutex<Option<EngineCommunicator>>>),
    Cuda(Arc<Mutex<Option<CudaCommunicator>>>),
}

/// A communicator of `nranks` processes on this host, joined at the
/// rendezvous name `rendezvous` as `rank`.
///
/// Buffers are numpy arrays, bytearrays, memoryviews, torch CPU tensors: any
/// C-contiguous object with the buffer protocol or `__dlpack__`, of float32,
/// float64, float16, bfloat16, int32, int64 or uint8. Nothing is copied on
/// the way in or out.
#[pyclass(module = "pcieipc", name = "Communicator")]
pub struct Communicator {
    owner: Owner,
    rank: usize,
    nranks: usize,
    transport: &'static str,
}

pub fn parse_op(op: &str, rank: usize) -> PyResult<ReduceOp> {
    op.parse()
        .map_err(|error: pcieipc::engine::UnknownReduceOp| invalid(error.to_string(), rank))
}

pub fn parse_secret(secret: Option<&str>, rank: usize) -> PyResult<Option<JobSecret>> {
    match secret {
        Some(text) => text.parse().map(Some),
        None => JobSecret::from_env(),
    }
    .map_err(|error| invalid(format!("job secret: {error}"), rank))
}

pub fn seconds(value: f64, what: &str, rank: usize) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        invalid(
            format!("{what} must be a non-negative number of seconds, got {value}"),
            rank,
        )
    })
}

/// The options every communicator takes from Python.
pub fn comm_options(
    rank: usize,
    transport: &str,
    secret: Option<&str>,
    join_timeout: f64,
    peer_timeout: f64,
) -> PyResult<CommOptions> {
    Ok(CommOptions {
        transport: transport
            .parse::<TransportOptions>()
            .map_err(|error| invalid(error.to_string(), rank))?,
        secret: parse_secret(secret, rank)?,
        join_timeout: seconds(join_timeout, "join_timeout", rank)?,
        peer_timeout: seconds(peer_timeout, "peer_timeout", rank)?,
        ..CommOptions::default()
    })
}

impl Communicator {
    /// The control plane of a CUDA communicator, as a host communicator.
    pub fn of_cuda(
        cuda: Arc<Mutex<Option<CudaCommunicator>>>,
        rank: usize,
        nranks: usize,
        transport: &'static str,
    ) -> Communicator {
        Communicator {
            owner: Owner::Cuda(cuda),
            rank,
            nranks,
            transport,
        }
    }

    /// Runs `call` on the engine communicator without the interpreter lock.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut EngineCommunicator) -> Result<R, EngineError> + Send,
    ) -> PyResult<R> {
        let rank = self.rank;
        let closed = || crate::errors::to_closed(rank);
        let outcome = py.detach(|| match &self.owner {
            Owner::Own(cell) => {
                let mut guard = cell.lock().unwrap_or_else(|poison| poison.into_inner());
                guard.as_mut().map(call)
            }
            Owner::Cuda(cell) => {
                let mut guard = cell.lock().unwrap_or_else(|poison| poison.into_inner());
                guard.as_mut().map(|cuda| call(cuda.control()))
            }
        });
        match outcome {
            None => Err(closed()),
            Some(result) => result.map_err(|error| to_python(error, rank)),
        }
    }

    /// `object`'s memory on the host, or an error naming `what`.
    fn host_memory(
        &self,
        object: &Bound<'_, PyAny>,
        what: &str,
        writable: bool,
    ) -> PyResult<Memory> {
        let memory = Memory::of(object, what, writable)?;
        match memory.device {
            Device::Host => Ok(memory),
            Device::Cuda(ordinal) => Err(invalid(
                format!(
                    "{what} is on GPU {ordinal}: a host communicator takes host memory \
                     (CudaCommunicator takes CUDA tensors)"
                ),
                self.rank,
            )),
        }
    }
}

/// A slice over `memory`.
///
/// # Safety
///
/// `memory` holds `count` initialised elements of `T` (its dtype), alive and
/// not written by anyone else while the slice lives.
unsafe fn slice<T>(memory: &Memory) -> &[T] {
    // SAFETY: the caller's promise; `Memory::checked` verified alignment.
    unsafe { std::slice::from_raw_parts(memory.address as *const T, memory.count) }
}

/// As `slice`, writable.
///
/// # Safety
///
/// As `slice`, and no other reference to the memory exists while it lives.
#[allow(clippy::mut_from_ref)]
unsafe fn slice_mut<T>(memory: &Memory) -> &mut [T] {
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts_mut(memory.address as *mut T, memory.count) }
}

#[pymethods]
impl Communicator {
    /// Joins the communicator: returns once all `nranks` ranks have joined.
    ///
    /// `transport`: "shm" (shared memory, the default) or "pcieipc" (the
    /// kernel module's devices). `secret`: the job secret as 32 hex digits
    /// (default: the PCIEIPC_JOB_SECRET environment variable; none: any
    /// process of this user may join). Timeouts are in seconds.
    #[new]
    // One argument per keyword of the Python signature.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (rendezvous, rank, nranks, *, transport="shm", secret=None, join_timeout=30.0, peer_timeout=60.0))]
    fn new(
        py: Python<'_>,
        rendezvous: &str,
        rank: usize,
        nranks: usize,
        transport: &str,
        secret: Option<&str>,
        join_timeout: f64,
        peer_timeout: f64,
    ) -> PyResult<Communicator> {
        let options = comm_options(rank, transport, secret, join_timeout, peer_timeout)?;
        let communicator = py
            .detach(|| EngineCommunicator::init(rendezvous, rank, nranks, options))
            .map_err(|error| to_python(error, rank))?;
        let transport = communicator.transport_name();
        Ok(Communicator {
            owner: Owner::Own(Box::new(Mutex::new(Some(communicator)))),
            rank,
            nranks,
            transport,
        })
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the communicator has.
    #[getter]
    fn nranks(&self) -> usize {
        self.nranks
    }

    /// The transport's name ("shm", "pcieipc").
    #[getter]
    fn transport(&self) -> &'static str {
        self.transport
    }

    /// `output[i]` = `op` over all ranks' `input[i]`; in place when `output`
    /// is None or the same memory. `op`: "sum", "prod", "min", "max", "avg"
    /// (avg divides integers with truncation).
    #[pyo3(signature = (input, output=None, op="sum"))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        op: &str,
    ) -> PyResult<()> {
        let op = parse_op(op, self.rank)?;
        let Some(output) = output else {
            let buffer = self.host_memory(input, "all_reduce buffer", true)?;
            return self.run(py, |comm| {
                pcieipc::with_element!(buffer.dtype, T => {
                    // SAFETY: `buffer` is the caller's writable memory of
                    // `count` elements of T, held for the call.
                    comm.all_reduce_in_place(unsafe { slice_mut::<T>(&buffer) }, op)
                })
            });
        };
        let source = self.host_memory(input, "all_reduce input", false)?;
        let target = self.host_memory(output, "all_reduce output", true)?;
        source.same_type_as(&target, "all_reduce", self.rank)?;
        if source.overlaps_partly(&target) {
            return Err(invalid(
                "all_reduce: input and output overlap in part",
                self.rank,
            ));
        }
        let in_place = source.address == target.address;
        self.run(py, |comm| {
            pcieipc::with_element!(source.dtype, T => {
                if in_place {
                    // SAFETY: as above; one buffer.
                    comm.all_reduce_in_place(unsafe { slice_mut::<T>(&target) }, op)
                } else {
                    // SAFETY: two disjoint buffers (checked above) of the
                    // caller's, held for the call; the engine checks lengths.
                    comm.all_reduce(unsafe { slice::<T>(&source) }, unsafe { slice_mut::<T>(&target) }, op)
                }
            })
        })
    }

    /// Rank r's `output` = `op` over all ranks' `input[r·m:(r+1)·m]`, where
    /// m = len(output) and len(input) = nranks·m.
    #[pyo3(signature = (input, output, op="sum"))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
    ) -> PyResult<()> {
        let op = parse_op(op, self.rank)?;
        let source = self.host_memory(input, "reduce_scatter input", false)?;
        let target = self.host_memory(output, "reduce_scatter output", true)?;
        source.same_type_as(&target, "reduce_scatter", self.rank)?;
        if source.overlaps_partly(&target) || source.address == target.address {
            return Err(invalid(
                "reduce_scatter: input and output overlap",
                self.rank,
            ));
        }
        self.run(py, |comm| {
            pcieipc::with_element!(source.dtype, T => {
                // SAFETY: disjoint buffers of the caller's, held for the call.
                comm.reduce_scatter(unsafe { slice::<T>(&source) }, unsafe { slice_mut::<T>(&target) }, op)
            })
        })
    }

    /// `output[r·m:(r+1)·m]` = rank r's `input`, where m = len(input) and
    /// len(output) = nranks·m. `input` may be this rank's part of `output`.
    fn all_gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let source = self.host_memory(input, "all_gather input", false)?;
        let target = self.host_memory(output, "all_gather output", true)?;
        source.same_type_as(&target, "all_gather", self.rank)?;
        let own_part = target.address + self.rank * source.bytes();
        let in_place = source.address == own_part && target.count == self.nranks * source.count;
        if !in_place && (source.overlaps_partly(&target) || source.address == target.address) {
            return Err(invalid(
                "all_gather: input overlaps output other than as this rank's part",
                self.rank,
            ));
        }
        self.run(py, |comm| {
            pcieipc::with_element!(source.dtype, T => {
                if in_place {
                    // The engine takes input and output as separate slices:
                    // this rank's part is copied out first.
                    // SAFETY: the caller's memory, held for the call.
                    let own = unsafe { slice::<T>(&source) }.to_vec();
                    // SAFETY: the output, the only live reference to it now.
                    comm.all_gather(&own, unsafe { slice_mut::<T>(&target) })
                } else {
                    // SAFETY: disjoint buffers of the caller's, held for the call.
                    comm.all_gather(unsafe { slice::<T>(&source) }, unsafe { slice_mut::<T>(&target) })
                }
            })
        })
    }

    /// Every rank's `buffer` = rank `root`'s.
    #[pyo3(signature = (buffer, root=0))]
    fn broadcast(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, root: usize) -> PyResult<()> {
        let buffer = self.host_memory(buffer, "broadcast buffer", true)?;
        self.run(py, |comm| {
            pcieipc::with_element!(buffer.dtype, T => {
                // SAFETY: the caller's writable memory, held for the call.
                comm.broadcast(unsafe { slice_mut::<T>(&buffer) }, root)
            })
        })
    }

    /// Returns once every rank has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |comm| {
            comm.all_reduce_in_place(&mut [0u8], ReduceOp::Max)
        })
    }

    /// Leaves the communicator (peers still in a collective with this rank
    /// are told it left). Later calls raise. A communicator that is garbage
    /// collected is closed too.
    fn close(&self) {
        if let Owner::Own(cell) = &self.owner {
            cell.lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .take();
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _kind: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) {
        self.close();
    }

    fn __repr__(&self) -> String {
        format!(
            "<pcieipc.Communicator rank {} of {} over {}>",
            self.rank, self.nranks, self.transport
        )
    }
}
