//! Which rank moves which part of a buffer at which step: pure arithmetic on
//! ranks, counts and chunk sizes, with no memory, no I/O and no `unsafe`.
//! The host collectives and the CUDA backend both take their steps from here,
//! so an algorithm's math is written once. `select` picks the all_reduce
//! algorithm from the message size, the rank count and what the transport
//! can do.

#![forbid(unsafe_code)]

mod algorithm;
mod broadcast;
mod direct;
mod one_shot;
mod partition;
mod ring;

pub use algorithm::{select, Algorithm, AlgorithmChoice, Limits, UnknownAlgorithm};
pub use broadcast::Chain;
pub use direct::Direct;
pub use one_shot::OneShot;
pub use partition::{clip, part, part_aligned};
pub use ring::{Ring, RingKind, StepRole};
