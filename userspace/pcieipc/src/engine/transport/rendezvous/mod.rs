//! The rendezvous: ranks meet on an abstract Unix socket named after the job
//! (and its secret's tag), rank 0 checks that every rank joined exactly once
//! for the same rank count, and hands each the transport's shared segment (a
//! sealed memfd, over SCM_RIGHTS), the agreed window sizes and every rank's
//! pid (for liveness).
//!
//! Who may join: only processes of this user (`SO_PEERCRED`, checked by both
//! sides, so a rank never joins a socket another user bound first) that
//! present the job's secret. Pids come from the kernel, not from the ranks.
//! A connection that says nothing, or something else, is dropped at its own
//! deadline while rank 0 goes on accepting.
//!
//! The socket is in Linux's abstract namespace, so nothing is left in the file
//! system whatever happens to the ranks; it is closed as soon as everyone has
//! joined.

mod host;
mod join;
mod meeting;
mod secret;
mod wire;

#[cfg(test)]
mod tests;

pub(crate) use host::host;
pub(crate) use join::join;
pub use secret::{BadSecret, JobSecret, SECRET_ENV};
