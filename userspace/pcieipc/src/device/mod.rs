//! Typed client of the `/dev/pcieipc` kernel module.
//!
//! Each ioctl of `include/uapi/pcieipc.h` gets one method that fills the
//! argsz-versioned struct, calls the raw ioctl from `pcieipc_uapi::ioctl` and
//! returns plain Rust values; errors carry the device path.

mod dma;
mod fault;
mod info;
mod interrupts;
mod link_control;
mod mapped_window;
mod node;
mod retrain;

pub use dma::{DmaBuffer, DmaEngine, DmaTicket, DmaWaitResult};
pub use info::{BarInfo, BoundDevice, DeviceKind, DeviceState, IrqType};
pub use interrupts::WaitResult;
pub use link_control::{
    allow_line, parse_allow_list, AllowListError, LinkControl, LinkControlError,
    LINK_CONTROL_PARAMETER,
};
pub use mapped_window::MappedWindow;
pub use node::{Device, DeviceError, ModuleVersion, ABI_VERSION, DEFAULT_PATH};
pub use retrain::{Retrain, RetrainRefusal, TargetSpeed};
