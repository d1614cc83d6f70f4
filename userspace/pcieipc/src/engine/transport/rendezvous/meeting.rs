//! What both sides of the rendezvous share: the socket's name, the errors'
//! context, and what a rank leaves with.

use std::os::fd::OwnedFd;

use super::secret::JobSecret;
use crate::engine::error::EngineError;
use crate::engine::transport::WindowSizes;

/// What a rank leaves the rendezvous with.
pub(crate) struct Joined {
    pub segment: OwnedFd,
    pub sizes: WindowSizes,
    pub pids: Vec<u32>,
}

pub(super) fn socket_name(name: &str, secret: Option<&JobSecret>) -> Vec<u8> {
    match secret {
        Some(secret) => format!("pcieipc/{name}/{:016x}", secret.name_tag()),
        None => format!("pcieipc/{name}"),
    }
    .into_bytes()
}

pub(super) struct Context<'a> {
    pub(super) name: &'a str,
}

impl Context<'_> {
    pub(super) fn io(&self, context: &'static str) -> impl Fn(std::io::Error) -> EngineError + '_ {
        move |source| EngineError::RendezvousIo {
            name: self.name.to_owned(),
            context,
            source,
        }
    }

    pub(super) fn protocol(&self, rank: usize, reason: impl Into<String>) -> EngineError {
        EngineError::RendezvousProtocol {
            name: self.name.to_owned(),
            rank,
            reason: reason.into(),
        }
    }
}
