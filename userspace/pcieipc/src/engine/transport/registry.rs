//! The transports this build provides, by the names users pick (the CLI's
//! `--transport` and its help come from `TRANSPORTS`). A transport is added
//! here and in its own folder; nothing else in the engine changes.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::rendezvous::JobSecret;
use super::{pcieipc, shm, Capabilities, Transport, WindowSizes};
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
    fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Transport>, EngineError>;
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

    pub(crate) fn open(&self, setup: &Setup<'_>) -> Result<Box<dyn Transport>, EngineError> {
        self.0.open(setup)
    }
}

impl Default for TransportOptions {
    fn default() -> TransportOptions {
        (TRANSPORTS[0].defaults)()
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

/// Every transport, the default first.
pub const TRANSPORTS: &[Registered] = &[shm::REGISTERED, pcieipc::REGISTERED];

/// Every transport as `name (summary)`, for `--help`.
pub fn describe_all() -> String {
    TRANSPORTS
        .iter()
        .map(|registered| format!("{} ({})", registered.name, registered.summary))
        .collect::<Vec<_>>()
        .join(", ")
}

fn names() -> String {
    TRANSPORTS
        .iter()
        .map(|registered| registered.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A transport name this build does not provide.
#[derive(Debug, thiserror::Error)]
#[error("unknown transport {name:?} (this build provides: {provided})")]
pub struct UnknownTransport {
    pub name: String,
    pub provided: String,
}

impl FromStr for TransportOptions {
    type Err = UnknownTransport;
    /// The registered transport `name`, with its default options.
    fn from_str(name: &str) -> Result<TransportOptions, UnknownTransport> {
        TRANSPORTS
            .iter()
            .find(|registered| registered.name == name)
            .map(|registered| (registered.defaults)())
            .ok_or_else(|| UnknownTransport {
                name: name.to_owned(),
                provided: names(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_their_transport_and_unknown_ones_list_the_rest() {
        for registered in TRANSPORTS {
            let options: TransportOptions = registered.name.parse().unwrap();
            assert_eq!(options.name(), registered.name);
            assert!(!registered.summary.is_empty());
        }
        assert_eq!(TransportOptions::default().name(), "shm");
        let unknown = "tcp".parse::<TransportOptions>().unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "unknown transport \"tcp\" (this build provides: shm, pcieipc)"
        );
    }
}
