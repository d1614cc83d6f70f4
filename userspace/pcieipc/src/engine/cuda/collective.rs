//! One all_reduce of device buffers: checks, the call every rank must agree
//! on, the host-staged path, and the GPU algorithms' common ground.

use std::sync::Arc;

use super::communicator::{on_rank, CudaCommunicator, DataPath};
use super::gpu::{CudaError, DeviceBuffer};
use super::kernels::Kernel;
use crate::engine::{Algorithm, CallDescriptor, CallKind, DType, Element, EngineError, ReduceOp};
use crate::trace::monotonic_ns;

impl CudaCommunicator {
    /// `output[i]` = `op` over all ranks' `input[i]`.
    pub fn all_reduce<T: Element + Default>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        if self.hands_off_on_gpu() {
            let stream = self.gpu.stream().clone();
            self.all_reduce_on_stream(input, output, op, &stream)?;
            return self.wait_for_gpu();
        }
        EngineError::check_length("all_reduce output", output.len(), input.len())?;
        self.all_reduce_at::<T>(input, output.address(), op)
            .and_then(|staged| match staged {
                Some(host) => output.copy_from_host(&host).map_err(on_rank(self.rank)),
                None => Ok(()),
            })
    }

    /// `buffer[i]` = `op` over all ranks' `buffer[i]`.
    pub fn all_reduce_in_place<T: Element + Default>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        if self.hands_off_on_gpu() {
            let stream = self.gpu.stream().clone();
            self.all_reduce_in_place_on_stream(buffer, op, &stream)?;
            return self.wait_for_gpu();
        }
        let address = buffer.address();
        self.all_reduce_at::<T>(buffer, address, op)
            .and_then(|staged| match staged {
                Some(host) => buffer.copy_from_host(&host).map_err(on_rank(self.rank)),
                None => Ok(()),
            })
    }

    /// The all_reduce of `source` into the buffer at `output` (the same
    /// address for in place). On the host-staged path the result comes back
    /// in host memory for the caller to upload.
    fn all_reduce_at<T: Element + Default>(
        &mut self,
        source: &DeviceBuffer<T>,
        output: u64,
        op: ReduceOp,
    ) -> Result<Option<Vec<T>>, EngineError> {
        let err = on_rank(self.rank);
        if !Arc::ptr_eq(source.gpu(), &self.gpu) {
            return Err(EngineError::WrongGpu {
                rank: self.rank,
                buffer_gpu: source.gpu().ordinal(),
                gpu: self.gpu.ordinal(),
            });
        }
        let (input, count) = (source.address(), source.len());
        let algorithm = self.algorithm_for::<T>(count);
        let bytes = count * std::mem::size_of::<T>();
        let registered = self
            .registered
            .get(&input)
            .is_some_and(|registration| registration.bytes >= bytes);
        let call = CallDescriptor {
            kind: CallKind::AllReduce,
            dtype: T::DTYPE,
            op: Some(op),
            count: count as u64,
            root: 0,
            algorithm,
            chunk_bytes: self.layout.slot_bytes as u32,
            bypass_slots: false,
        };
        self.check_call(call, registered)?;
        self.last_call = Some(CallDescriptor {
            chunk_bytes: match algorithm {
                Algorithm::Ring => call.chunk_bytes,
                Algorithm::OneShot | Algorithm::Direct => 0,
            },
            ..call
        });
        if let DataPath::HostStaged { .. } = self.path {
            let mut host = vec![T::default(); count];
            source.copy_to_host(&mut host).map_err(&err)?;
            self.control.all_reduce_in_place(&mut host, op)?;
            self.last_call = self.control.last_call();
            return Ok(Some(host));
        }
        if self.nranks == 1 || count == 0 {
            if input != output {
                self.gpu.copy(output, input, bytes).map_err(&err)?;
            }
            self.finish_gpu().map_err(&err)?;
            return Ok(None);
        }
        let kernel = self.gpu.kernel(T::DTYPE, op).map_err(&err)?;
        let divide_by = if op == ReduceOp::Avg {
            self.nranks as u32
        } else {
            0
        };
        let call = DeviceCall {
            dtype: T::DTYPE,
            kernel: &kernel,
            input,
            output,
            count,
            divide_by,
            registered_input: registered,
        };
        match algorithm {
            Algorithm::Ring => self.run_ring(&call)?,
            Algorithm::OneShot => self.run_one_shot(&call)?,
            Algorithm::Direct => unreachable!("init refuses the direct algorithm"),
        }
        Ok(None)
    }

    /// Rank r's `output` = `op` over all ranks' `input[r·m..(r+1)·m]`
    /// (m = `output.len()`). Needs the GPU hand-off.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<(), EngineError> {
        let stream = self.gpu.stream().clone();
        self.reduce_scatter_on_stream(input, output, op, &stream)?;
        self.wait_for_gpu()
    }

    /// `output[r·m..(r+1)·m]` = rank r's `input` (m = `input.len()`). Needs
    /// the GPU hand-off.
    pub fn all_gather<T: Element>(
        &mut self,
        input: &DeviceBuffer<T>,
        output: &mut DeviceBuffer<T>,
    ) -> Result<(), EngineError> {
        let stream = self.gpu.stream().clone();
        self.all_gather_on_stream(input, output, &stream)?;
        self.wait_for_gpu()
    }

    /// Every rank's `buffer` = rank `root`'s. Needs the GPU hand-off.
    pub fn broadcast<T: Element>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        root: usize,
    ) -> Result<(), EngineError> {
        let stream = self.gpu.stream().clone();
        self.broadcast_on_stream(buffer, root, &stream)?;
        self.wait_for_gpu()
    }

    /// Waits for this rank's GPU to run what is queued (polling, then
    /// asleep): a "GPU event" wait in the trace.
    pub(super) fn finish_gpu(&self) -> Result<(), CudaError> {
        let traced_from = self.control.trace().map(|_| monotonic_ns());
        let outcome = self.gpu.finish_after_polling(self.gpu_poll);
        if let (Some(trace), Some(start)) = (self.control.trace(), traced_from) {
            trace.span("GPU event", "wait", start, Vec::new());
        }
        outcome
    }

    /// Waits, asleep on a blocking-sync event, until this GPU's stream has
    /// run every call queued on it, then reports what the hand-off kernels
    /// reported (the blocking calls end with this).
    pub fn wait_for_gpu(&mut self) -> Result<(), EngineError> {
        self.gpu.finish().map_err(on_rank(self.rank))?;
        match self.gpu_failure() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Exchanges call descriptors and fails every rank, naming the peer,
    /// when they differ.
    fn check_call(&mut self, call: CallDescriptor, registered: bool) -> Result<(), EngineError> {
        let [head, count, chunk] = call.to_words();
        let mine = [head, count, chunk, u64::from(registered)].map(|word| word as i64);
        let mut all = vec![0i64; 4 * self.nranks];
        self.control.all_gather(&mine, &mut all)?;
        for (peer, words) in all.chunks_exact(4).enumerate() {
            let peer_call =
                CallDescriptor::from_words([words[0], words[1], words[2]].map(|word| word as u64));
            if peer_call != Some(call) {
                return Err(EngineError::MismatchedCall {
                    rank: self.rank,
                    call,
                    peer,
                    peer_call: peer_call.unwrap_or(call),
                });
            }
            if words[3] != i64::from(registered) {
                let (here, there) = if registered {
                    ("", "not ")
                } else {
                    ("not ", "")
                };
                return Err(EngineError::MismatchedRegistration {
                    rank: self.rank,
                    peer,
                    detail: format!("the input is {here}registered here, {there}registered there"),
                });
            }
        }
        Ok(())
    }

    /// Waits (asleep) for this rank's queued GPU work, then meets every peer
    /// on the host. A rank whose GPU work failed still comes to the meeting,
    /// so its peers learn it at once instead of timing out.
    pub(super) fn barrier(&mut self, queued: Result<(), CudaError>) -> Result<(), EngineError> {
        let local = queued.and_then(|()| self.finish_gpu());
        let mut failed = [local.as_ref().map_or(self.rank as i64 + 1, |_| 0)];
        self.control
            .all_reduce_in_place(&mut failed, ReduceOp::Max)?;
        local.map_err(on_rank(self.rank))?;
        match failed[0] {
            0 => Ok(()),
            rank => Err(EngineError::PeerGpuFailed {
                rank: rank as usize - 1,
            }),
        }
    }
}

/// One all_reduce on the peer-to-peer path.
pub(super) struct DeviceCall<'a> {
    pub(super) dtype: DType,
    pub(super) kernel: &'a Kernel,
    pub(super) input: u64,
    pub(super) output: u64,
    pub(super) count: usize,
    /// The rank count for avg, else 0.
    pub(super) divide_by: u32,
    /// Whether step 0 reads the predecessor's input buffer directly.
    pub(super) registered_input: bool,
}
