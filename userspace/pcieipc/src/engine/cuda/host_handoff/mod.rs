//! The host hand-off: ranks meet on the host after every step of a call.
//! Each all_reduce step is queued on the GPU's own stream (a reduce kernel
//! that reads the predecessor's chunk straight from its mapped staging
//! block, or the copy engine), the rank waits for its GPU and meets its
//! peers on the control plane (`meeting`); the steps come from `schedule`
//! (`ring`, `one_shot`). Without peer-to-peer, and for the calls the GPU
//! steps do not cover, data goes through host memory and the control
//! plane's own collectives (`through_host`). A call is ordered after the
//! work its stream already holds, and done when it returns.

mod device_call;
mod meeting;
mod one_shot;
mod ring;
mod through_host;

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaEvent;

use super::call::GpuCall;
use super::error::{on_rank, CudaError};
use super::gpu::Gpu;
use super::kernels::ONE_SHOT_MAX_RANKS;
use super::memory::DeviceBuffer;
use super::options::PeerRead;
use super::registration::Registrations;
use super::staging::Staging;
use crate::engine::schedule::{self, Limits};
use crate::engine::{
    Algorithm, AlgorithmChoice, CallDescriptor, CallKind, Communicator, EngineError, ReduceOp,
};
use device_call::DeviceCall;
use meeting::Meeting;

/// A rank's side of the host hand-off.
pub(super) struct HostHandoff {
    gpu: Arc<Gpu>,
    algorithm: AlgorithmChoice,
    staging: Staging,
    /// One chunk of local memory the copy engine fills on `PeerRead::CopyEngine`.
    landing: Option<DeviceBuffer<u8>>,
    /// Without peer-to-peer: every all_reduce goes through host memory.
    staged: bool,
    gpu_poll: Duration,
    /// Which one-shot buffer the next round uses (they alternate).
    one_shot_parity: usize,
    /// Orders the GPU's own stream after a call's stream.
    ordering: CudaEvent,
    last_call: Option<CallDescriptor>,
}

impl HostHandoff {
    /// The hand-off over `staging` (its peers' blocks open unless `staged`).
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        staging: Staging,
        algorithm: AlgorithmChoice,
        peer_read: PeerRead,
        gpu_poll: Duration,
        staged: bool,
    ) -> Result<HostHandoff, CudaError> {
        let landing = match peer_read {
            PeerRead::Direct => None,
            PeerRead::CopyEngine => Some(DeviceBuffer::zeroed(gpu, staging.layout.slot_bytes())?),
        };
        Ok(HostHandoff {
            gpu: gpu.clone(),
            algorithm,
            staging,
            landing,
            staged,
            gpu_poll,
            one_shot_parity: 0,
            ordering: gpu.new_event()?,
            last_call: None,
        })
    }

    pub(super) fn peer_read(&self) -> PeerRead {
        match self.landing {
            Some(_) => PeerRead::CopyEngine,
            None => PeerRead::Direct,
        }
    }

    /// Bytes per ring chunk (one staging slot).
    pub(super) fn chunk_bytes(&self) -> usize {
        self.staging.layout.slot_bytes()
    }

    /// The last call's descriptor (chunk_bytes 0 on the one-shot path; the
    /// control plane's own for calls through host memory).
    pub(super) fn last_call(&self) -> Option<CallDescriptor> {
        self.last_call
    }

    /// The algorithm an all_reduce of `bytes` among `nranks` ranks takes.
    pub(super) fn algorithm(&self, bytes: usize, nranks: usize) -> Algorithm {
        let limits = Limits {
            one_shot_read_budget: self.staging.layout.one_shot_bytes(),
            one_shot_max_ranks: ONE_SHOT_MAX_RANKS,
            direct_messages: None,
        };
        schedule::select(self.algorithm, bytes, nranks, &limits)
    }

    /// Runs `call` (checked by the communicator) to completion.
    pub(super) fn run(
        &mut self,
        control: &mut Communicator,
        registrations: &Registrations,
        call: &GpuCall,
    ) -> Result<(), EngineError> {
        let err = on_rank(control.rank());
        // The copies below use the driver's calls directly: the caller's
        // thread (a framework's, say) may have another context current.
        self.gpu.bind().map_err(&err)?;
        self.gpu
            .order(&self.ordering, call.stream_of(&self.gpu), self.gpu.stream())
            .map_err(&err)?;
        if call.kind == CallKind::AllReduce {
            return self.all_reduce(control, registrations, call);
        }
        through_host::run(&self.gpu, control, call)?;
        self.last_call = control.last_call();
        Ok(())
    }

    fn all_reduce(
        &mut self,
        control: &mut Communicator,
        registrations: &Registrations,
        call: &GpuCall,
    ) -> Result<(), EngineError> {
        let (rank, nranks) = (control.rank(), control.nranks());
        let err = on_rank(rank);
        let bytes = call.bytes();
        let algorithm = self.algorithm(bytes, nranks);
        let registered = registrations.covers(call.input, bytes);
        let descriptor = call.descriptor(algorithm, self.staging.layout.slot_bytes() as u32);
        check_call(control, descriptor, registered)?;
        self.last_call = Some(CallDescriptor {
            chunk_bytes: match algorithm {
                Algorithm::Ring => descriptor.chunk_bytes,
                Algorithm::OneShot | Algorithm::Direct => 0,
            },
            ..descriptor
        });
        if self.staged {
            through_host::run(&self.gpu, control, call)?;
            self.last_call = control.last_call();
            return Ok(());
        }
        let mut meeting = Meeting {
            gpu: &self.gpu,
            control,
            poll: self.gpu_poll,
        };
        if nranks == 1 || call.count == 0 {
            if call.input != call.output {
                self.gpu
                    .copy(call.output, call.input, bytes)
                    .map_err(&err)?;
            }
            return meeting.finish_gpu().map_err(&err);
        }
        let kernel = self.gpu.kernel(call.dtype, call.op).map_err(&err)?;
        let device_call = DeviceCall {
            kernel: &kernel,
            input: call.input,
            output: call.output,
            count: call.count,
            element: call.dtype.size_bytes(),
            divide_by: if call.op == ReduceOp::Avg {
                nranks as u32
            } else {
                0
            },
            registered_input: registered,
        };
        match algorithm {
            Algorithm::Ring => ring::run(
                &mut meeting,
                &self.staging,
                self.landing.as_ref(),
                registrations,
                &device_call,
            ),
            Algorithm::OneShot => one_shot::run(
                &mut meeting,
                &self.staging,
                &mut self.one_shot_parity,
                &device_call,
            ),
            Algorithm::Direct => unreachable!("init refuses the direct algorithm"),
        }
    }
}

/// Exchanges call descriptors (and whether the input is registered) and
/// fails every rank, naming the peer, when they differ.
fn check_call(
    control: &mut Communicator,
    call: CallDescriptor,
    registered: bool,
) -> Result<(), EngineError> {
    let (rank, nranks) = (control.rank(), control.nranks());
    let [head, count, chunk] = call.to_words();
    let mine = [head, count, chunk, u64::from(registered)].map(|word| word as i64);
    let mut all = vec![0i64; 4 * nranks];
    control.all_gather(&mine, &mut all)?;
    for (peer, words) in all.chunks_exact(4).enumerate() {
        let peer_call =
            CallDescriptor::from_words([words[0], words[1], words[2]].map(|word| word as u64));
        if peer_call != Some(call) {
            return Err(EngineError::MismatchedCall {
                rank,
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
                rank,
                peer,
                detail: format!("the input is {here}registered here, {there}registered there"),
            });
        }
    }
    Ok(())
}
