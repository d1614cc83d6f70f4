//! `pcieipc.CudaCommunicator`: the collectives on CUDA tensors, handed to
//! the engine's CUDA communicator by device address and stream (pcieipc.torch
//! passes torch's current one, or the communicator's own is used): queued
//! there on the GPU hand-off, run in order with the stream's work on the
//! host hand-off (ranks sharing a GPU).

use std::sync::{Arc, Mutex};

use pcieipc::engine::cuda::{
    CudaCommunicator as EngineCudaCommunicator, CudaOptions, CudaStream, DataPath, Gpu, GpuCall,
    Handoff, PeerToPeer,
};
use pcieipc::engine::{CallKind, DType, EngineError, ReduceOp};
use pyo3::prelude::*;

use crate::errors::{device_error, invalid, to_closed, to_python};
use crate::host::{comm_options, parse_op, seconds, Communicator};
use crate::memory::{Device, Memory};

/// A communicator of `nranks` processes, each with CUDA tensors on GPU
/// `device`, joined at `rendezvous` as `rank`.
///
/// Collectives are ordered on the caller's stream (or the communicator's
/// own, `stream`). On the GPU hand-off (`hands_off_on_gpu`, which init takes
/// when every rank has a GPU of its own) they are queued and return at
/// once; `synchronize()` waits for the own stream. Where ranks share a GPU
/// the hand-off is on the host: a call runs after the stream's queued work
/// and is done when it returns.
#[pyclass(module = "pcieipc", name = "CudaCommunicator")]
pub struct CudaCommunicator {
    inner: Arc<Mutex<Option<EngineCudaCommunicator>>>,
    rank: usize,
    nranks: usize,
    device: usize,
    transport: &'static str,
    stream: usize,
    hands_off_on_gpu: bool,
    data_path: String,
}

impl CudaCommunicator {
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut EngineCudaCommunicator) -> Result<R, EngineError> + Send,
    ) -> PyResult<R> {
        let rank = self.rank;
        let outcome = py.detach(|| {
            let mut guard = self
                .inner
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            guard.as_mut().map(call)
        });
        match outcome {
            None => Err(to_closed(rank)),
            Some(result) => result.map_err(|error| to_python(error, rank)),
        }
    }

    /// `object`'s memory on this communicator's GPU.
    fn device_memory(&self, object: &Bound<'_, PyAny>, what: &str) -> PyResult<Memory> {
        let memory = Memory::of(object, what, true)?;
        match memory.device {
            Device::Cuda(ordinal) if ordinal as usize == self.device => Ok(memory),
            Device::Cuda(ordinal) => Err(invalid(
                format!(
                    "{what} is on GPU {ordinal}, the communicator on GPU {}",
                    self.device
                ),
                self.rank,
            )),
            Device::Host => Err(invalid(
                format!("{what} is in host memory: CudaCommunicator takes CUDA tensors"),
                self.rank,
            )),
        }
    }

    fn check_counts(&self, what: &str, got: usize, expected: usize) -> PyResult<()> {
        if got == expected {
            Ok(())
        } else {
            Err(invalid(
                format!("{what}: got {got} elements, expected {expected}"),
                self.rank,
            ))
        }
    }
}

/// A call of checked device memory, as the engine takes it.
struct Call {
    kind: CallKind,
    dtype: DType,
    op: ReduceOp,
    count: usize,
    input: usize,
    output: usize,
    root: usize,
    /// The caller's CUstream; `None`: the communicator's own.
    stream: Option<usize>,
}

impl Call {
    /// Hands the call to `comm`, ordered on its stream.
    ///
    /// # Safety
    ///
    /// `input` and `output` are device memory of `comm`'s GPU holding what
    /// `kind` reads and writes (checked by the caller), kept alive until the
    /// stream has run the call (pcieipc.torch queues on the tensors' own
    /// stream, on which torch's caching allocator orders their reuse).
    unsafe fn queue(self, comm: &mut EngineCudaCommunicator) -> Result<(), EngineError> {
        let stream: Option<Arc<CudaStream>> = match self.stream {
            None => None,
            Some(handle) => {
                // SAFETY: a stream handle the caller passed for this call;
                // torch keeps its streams alive for the process's life, and
                // any caller keeps a stream alive while work queued on it
                // runs.
                let borrowed = unsafe { comm.gpu().borrow_stream(handle) };
                Some(borrowed.map_err(|error| comm.cuda_error(error))?)
            }
        };
        // SAFETY: the caller's promise, as `from_raw` needs it.
        let call = unsafe {
            GpuCall::from_raw(
                self.kind,
                self.dtype,
                self.op,
                self.count,
                self.input as u64,
                self.output as u64,
                self.root,
            )
        };
        match &stream {
            None => comm.queue(call),
            Some(stream) => comm.queue(call.on_stream(stream)),
        }
    }
}

/// Keyword `name`'s `value` when it is None or within `range`.
fn within(
    name: &str,
    value: Option<i64>,
    range: std::ops::RangeInclusive<i64>,
    rank: usize,
) -> PyResult<Option<i64>> {
    match value {
        Some(value) if !range.contains(&value) => Err(invalid(
            format!(
                "{name} {value}: expected {} to {} (or None)",
                range.start(),
                range.end()
            ),
            rank,
        )),
        _ => Ok(value),
    }
}

/// `copy_engines_from` as Python gives it: bytes (0 or more) or "never".
fn copy_engines_threshold(value: &Bound<'_, PyAny>) -> Result<usize, String> {
    if let Ok(text) = value.extract::<String>() {
        if text == "never" {
            return Ok(usize::MAX);
        }
    } else if let Ok(bytes) = value.extract::<u64>() {
        if let Ok(bytes) = usize::try_from(bytes) {
            return Ok(bytes);
        }
    }
    Err(format!(
        "copy_engines_from {value}: expected bytes (0 or more), \"never\" or None"
    ))
}

#[pymethods]
impl CudaCommunicator {
    /// Joins the communicator on GPU `device` (a CUDA ordinal of this
    /// process): returns once all ranks have joined and checked
    /// peer-to-peer access.
    ///
    /// `handoff`: "auto" (on the GPU when every rank has its own GPU),
    /// "gpu" (always: ranks sharing a GPU then need MPS), "host". `p2p`:
    /// "auto" or "off" (data through pinned host memory over PCIe).
    /// `handoff_timeout`: seconds a GPU-side wait for a peer lasts before the
    /// call fails naming it. `handoff_blocks`: the most thread blocks (1 to
    /// 64) a GPU hand-off launch takes, the multiprocessors its kernels hold
    /// while they wait for peers; `None`: one a multiprocessor, up to 64.
    /// Through host memory (`p2p="off"`, or no peer-to-peer): two-shot
    /// all_reduce launches of `copy_engines_from` bytes and more move by the copy
    /// engines ("never": always by the kernels; `None`: 4 MiB), in chunks of
    /// about `copy_chunk_bytes` at most (16 to 1 GiB, two a segment at least;
    /// `None`: 4 MiB); rank 0's hold.
    /// The rest as for `Communicator`.
    #[new]
    // One argument per keyword of the Python signature.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (rendezvous, rank, nranks, device, *, transport="shm", secret=None, join_timeout=30.0, peer_timeout=60.0, handoff="auto", p2p="auto", handoff_timeout=10.0, handoff_blocks=None, copy_engines_from=None, copy_chunk_bytes=None))]
    fn new(
        py: Python<'_>,
        rendezvous: &str,
        rank: usize,
        nranks: usize,
        device: usize,
        transport: &str,
        secret: Option<&str>,
        join_timeout: f64,
        peer_timeout: f64,
        handoff: &str,
        p2p: &str,
        handoff_timeout: f64,
        handoff_blocks: Option<i64>,
        copy_engines_from: Option<&Bound<'_, PyAny>>,
        copy_chunk_bytes: Option<i64>,
    ) -> PyResult<CudaCommunicator> {
        let copy_engines_from = copy_engines_from
            .map(copy_engines_threshold)
            .transpose()
            .map_err(|message| invalid(message, rank))?;
        let copy_chunk_bytes =
            within("copy_chunk_bytes", copy_chunk_bytes, 16..=1 << 30, rank)?.map(|b| b as usize);
        let handoff_blocks =
            within("handoff_blocks", handoff_blocks, 1..=64, rank)?.map(|b| b as u32);
        let handoff = match handoff {
            "auto" => Handoff::Auto,
            "gpu" => Handoff::Gpu,
            "host" => Handoff::Host,
            other => {
                return Err(invalid(
                    format!("handoff {other:?}: expected \"auto\", \"gpu\" or \"host\""),
                    rank,
                ))
            }
        };
        let peer_to_peer = match p2p {
            "auto" => PeerToPeer::Auto,
            "off" => PeerToPeer::Off,
            other => {
                return Err(invalid(
                    format!("p2p {other:?}: expected \"auto\" or \"off\""),
                    rank,
                ))
            }
        };
        let options = CudaOptions {
            control: comm_options(rank, transport, secret, join_timeout, peer_timeout)?,
            handoff,
            peer_to_peer,
            handoff_timeout: seconds(handoff_timeout, "handoff_timeout", rank)?,
            handoff_blocks,
            copy_engines_from,
            copy_chunk_bytes,
            ..CudaOptions::default()
        };
        let gpu = py
            .detach(|| Gpu::open(device))
            .map_err(|error| device_error(error.to_string(), rank, format!("GPU {device}")))?;
        let mut communicator = py
            .detach(|| EngineCudaCommunicator::init(rendezvous, rank, nranks, gpu, options))
            .map_err(|error| to_python(error, rank))?;
        let transport = communicator.control().transport_name();
        let stream = communicator.gpu().stream_handle().cu_stream() as usize;
        let data_path = match communicator.data_path() {
            DataPath::PeerToPeer => "peer-to-peer".to_owned(),
            DataPath::HostMapped { reason } => format!("host memory, GPU hand-off ({reason})"),
            DataPath::HostStaged { reason } => format!("host-staged ({reason})"),
        };
        Ok(CudaCommunicator {
            hands_off_on_gpu: communicator.hands_off_on_gpu(),
            inner: Arc::new(Mutex::new(Some(communicator))),
            rank,
            nranks,
            device,
            transport,
            stream,
            data_path,
        })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn nranks(&self) -> usize {
        self.nranks
    }

    /// The CUDA ordinal of this rank's GPU.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// The communicator's own CUstream (as an integer): calls given no
    /// stream are queued on it, and `synchronize` waits for it.
    #[getter]
    fn stream(&self) -> usize {
        self.stream
    }

    /// Whether ranks hand over on the GPU (calls queued on a stream), or on
    /// the host (calls done when they return).
    #[getter]
    fn hands_off_on_gpu(&self) -> bool {
        self.hands_off_on_gpu
    }

    /// How data moves between the GPUs, and why when not peer-to-peer.
    #[getter]
    fn data_path(&self) -> &str {
        &self.data_path
    }

    /// The algorithm the last collective took ("ring", "one-shot",
    /// "direct"; None before the first): the engine's, on either hand-off
    /// (the control plane's where the data went through host memory).
    #[getter]
    fn last_algorithm(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        self.run(py, |comm| {
            Ok(comm.last_call().map(|call| call.algorithm.name()))
        })
    }

    /// The host control plane: a host communicator of the same ranks.
    #[getter]
    fn control(&self) -> Communicator {
        Communicator::of_cuda(self.inner.clone(), self.rank, self.nranks, self.transport)
    }

    /// Queues `output[i]` = `op` over all ranks' `input[i]` (in place when
    /// `output` is None or the same tensor). `stream`: the CUstream to order
    /// the call on (torch: `torch.cuda.current_stream().cuda_stream`); None:
    /// the communicator's own, `stream` above. On the host hand-off the call
    /// runs after the stream's queued work and is done when it returns.
    #[pyo3(signature = (input, output=None, op="sum", stream=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        op: &str,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let op = parse_op(op, self.rank)?;
        let source = self.device_memory(input, "all_reduce input")?;
        let target = output
            .map(|output| self.device_memory(output, "all_reduce output"))
            .transpose()?;
        let output_address = match &target {
            None => source.address,
            Some(target) => {
                source.same_type_as(target, "all_reduce", self.rank)?;
                self.check_counts("all_reduce output", target.count, source.count)?;
                if source.overlaps_partly(target) {
                    return Err(invalid(
                        "all_reduce: input and output overlap in part",
                        self.rank,
                    ));
                }
                target.address
            }
        };
        let call = Call {
            kind: CallKind::AllReduce,
            dtype: source.dtype,
            op,
            count: source.count,
            input: source.address,
            output: output_address,
            root: 0,
            stream,
        };
        // SAFETY: checked device memory of this GPU holding `count` elements
        // of `dtype` each (the same, or not overlapping); the caller keeps it
        // alive until the stream has run the call.
        self.run(py, |comm| unsafe { call.queue(comm) })
    }

    /// Queues rank r's `output` = `op` over all ranks'
    /// `input[r·m:(r+1)·m]` (m = numel(output)) on `stream`.
    #[pyo3(signature = (input, output, op="sum", stream=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let op = parse_op(op, self.rank)?;
        let source = self.device_memory(input, "reduce_scatter input")?;
        let target = self.device_memory(output, "reduce_scatter output")?;
        let dtype = source.same_type_as(&target, "reduce_scatter", self.rank)?;
        self.check_counts(
            "reduce_scatter input",
            source.count,
            self.nranks * target.count,
        )?;
        if source.overlaps_partly(&target) || source.address == target.address {
            return Err(invalid(
                "reduce_scatter: input and output overlap",
                self.rank,
            ));
        }
        let call = Call {
            kind: CallKind::ReduceScatter,
            dtype,
            op,
            count: target.count,
            input: source.address,
            output: target.address,
            root: 0,
            stream,
        };
        // SAFETY: checked, disjoint device memory of this GPU; kept alive by
        // the caller until the stream has run the call (as in all_reduce).
        self.run(py, |comm| unsafe { call.queue(comm) })
    }

    /// Queues `output[r·m:(r+1)·m]` = rank r's `input` (m = numel(input))
    /// on `stream`; `input` may be this rank's part of `output`.
    #[pyo3(signature = (input, output, stream=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let source = self.device_memory(input, "all_gather input")?;
        let target = self.device_memory(output, "all_gather output")?;
        let dtype = source.same_type_as(&target, "all_gather", self.rank)?;
        self.check_counts(
            "all_gather output",
            target.count,
            self.nranks * source.count,
        )?;
        let own_part = target.address + self.rank * source.bytes();
        if source.address != own_part
            && (source.overlaps_partly(&target) || source.address == target.address)
        {
            return Err(invalid(
                "all_gather: input overlaps output other than as this rank's part",
                self.rank,
            ));
        }
        let call = Call {
            kind: CallKind::AllGather,
            dtype,
            op: ReduceOp::Sum,
            count: source.count,
            input: source.address,
            output: target.address,
            root: 0,
            stream,
        };
        // SAFETY: checked device memory of this GPU (input may be this
        // rank's part of output, which the engine allows); kept alive by the
        // caller until the stream has run the call.
        self.run(py, |comm| unsafe { call.queue(comm) })
    }

    /// Queues every rank's `buffer` = rank `root`'s on `stream`.
    #[pyo3(signature = (buffer, root=0, stream=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        root: usize,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let buffer = self.device_memory(buffer, "broadcast buffer")?;
        let call = Call {
            kind: CallKind::Broadcast,
            dtype: buffer.dtype,
            op: ReduceOp::Sum,
            count: buffer.count,
            input: buffer.address,
            output: buffer.address,
            root,
            stream,
        };
        // SAFETY: checked device memory of this GPU; kept alive by the
        // caller until the stream has run the call.
        self.run(py, |comm| unsafe { call.queue(comm) })
    }

    /// Waits, asleep, until `stream` has run every queued collective, and
    /// raises the failure a GPU-side hand-off reported (naming the peer).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |comm| comm.wait_for_gpu())
    }

    /// Raises the failure a GPU-side hand-off has reported, without waiting.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |comm| comm.gpu_failure().map_or(Ok(()), Err))
    }

    /// Leaves the communicator after the GPU has run what was queued.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = py.detach(|| {
            self.inner
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .take()
        });
        match taken {
            Some(mut communicator) => {
                let outcome = py.detach(|| communicator.wait_for_gpu());
                py.detach(move || drop(communicator));
                outcome.map_err(|error| to_python(error, self.rank))
            }
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<pcieipc.CudaCommunicator rank {} of {} on GPU {}, {}>",
            self.rank, self.nranks, self.device, self.data_path
        )
    }
}
