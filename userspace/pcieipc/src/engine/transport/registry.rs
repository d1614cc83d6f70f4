//! The transports this build provides, by the names users pick (the CLI's
//! `--transport` and its help come from `TRANSPORTS`). A transport is added
//! here and in its own folder; nothing else in the engine changes.

use std::str::FromStr;

use super::config::{Registered, TransportOptions};
use super::{pcieipc, shm};

impl Default for TransportOptions {
    fn default() -> TransportOptions {
        (TRANSPORTS[0].defaults)()
    }
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
