//! One all_reduce of device memory on the host hand-off's peer-to-peer path,
//! as its ring and one-shot steps see it.

use crate::engine::cuda::kernels::Kernel;

pub(super) struct DeviceCall<'a> {
    /// The reduce kernels of the call's element type and reduction.
    pub(super) kernel: &'a Kernel,
    pub(super) input: u64,
    pub(super) output: u64,
    pub(super) count: usize,
    /// Bytes per element.
    pub(super) element: usize,
    /// The rank count for avg, else 0.
    pub(super) divide_by: u32,
    /// Whether the input is registered: the ring's first step then reads
    /// the predecessor's counterpart directly instead of its staging slot.
    pub(super) registered_input: bool,
}

impl DeviceCall<'_> {
    /// The device address of element `index` of the buffer at `base`.
    pub(super) fn at(&self, base: u64, index: usize) -> u64 {
        base + (index * self.element) as u64
    }
}
