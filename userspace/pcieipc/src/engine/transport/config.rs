//! What a transport is configured and opened with: its options, the setup
//! every rank gives it, and the entry a transport registers under.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::contract::{Capabilities, WindowSizes};
use super::rendezvous::JobSecret;
use super::segment::Transport;
use crate::engine::error::EngineError;

/// What a transport is given to set itself up on one rank.
#[derive(Clone, Copy, Debug)]
pub struct Setup<'a> {
    /// The job-unique name the ranks meet under.
    pub rendezvous: &'a str,
    pub rank: usize,
    pub nranks: usize,
    /// The windows this rank asks for; rank 0's request is the one used.
    pub sizes: WindowSizes,
    /// How long the rendezvous waits for every rank.
    pub join_timeout: Duration,
    /// The job's secret, which every rank must present.
    pub secret: Option<JobSecret>,
}

/// One transport's own options, and how to open it with them.
pub trait TransportConfig: fmt::Debug + Send + Sync {
    /// The name it is registered under.
    fn name(&self) -> &'static str;
    /// What the transport declares it can do (the same as its `Transport`
    /// reports once open).
    fn capabilities(&self) -> Capabilities;
    /// Joins the job described by `setup`. Returns once every rank has
    /// joined and the shared state is usable.
    fn open(&self, setup: &Setup<'_>) -> Result<Transport, EngineError>;
}

/// The transport a communicator uses, with that transport's options
/// (`CommOptions::transport`).
#[derive(Clone, Debug)]
pub struct TransportOptions(Arc<dyn TransportConfig>);

impl TransportOptions {
    pub fn new(options: impl TransportConfig + 'static) -> TransportOptions {
        TransportOptions(Arc::new(options))
    }

    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    pub(crate) fn open(&self, setup: &Setup<'_>) -> Result<Transport, EngineError> {
        self.0.open(setup)
    }
}

/// A transport this build provides.
pub struct Registered {
    pub name: &'static str,
    /// One line for `--help`.
    pub summary: &'static str,
    /// Its options with every choice left at the default.
    pub defaults: fn() -> TransportOptions,
}
