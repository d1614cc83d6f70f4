//! The host collectives: each algorithm a function that moves the steps
//! `schedule` gives it through a rank's slot streams (`SlotStreams`) and
//! waits on its peers (`Peers`), as NCCL's algorithms run over their
//! connectors. Nothing here touches shared memory by pointer or names a
//! transport; what a transport can do reaches the algorithms as the
//! settings the communicator agreed at init.

#![forbid(unsafe_code)]

mod broadcast;
mod buffers;
mod direct;
mod one_shot;
mod ring;
mod step_trace;

pub(crate) use broadcast::run as broadcast;
pub(crate) use buffers::{Buffers, RingCall};
pub(crate) use direct::run as direct;
pub(crate) use one_shot::run as one_shot;
pub(crate) use ring::{run as ring, RingSettings};
