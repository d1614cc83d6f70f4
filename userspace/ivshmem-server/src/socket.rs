//! The listening UNIX socket: bound over a stale socket file but never over a live server or
//! another kind of file, and removed when dropped if the file is still the one it bound.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::Error;

pub(crate) struct ListeningSocket {
    listener: UnixListener,
    path: PathBuf,
    /// (device, inode) of the socket file at bind time.
    file_identity: (u64, u64),
}

impl ListeningSocket {
    pub(crate) fn bind(path: &Path) -> Result<Self, Error> {
        remove_stale_socket(path)?;
        let listener = UnixListener::bind(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => Error::SocketDirMissing {
                path: path.to_owned(),
            },
            _ => Error::Bind {
                path: path.to_owned(),
                source,
            },
        })?;
        // Nonblocking so that a connection that vanished between poll and accept cannot
        // stall the loop.
        let file_identity = listener
            .set_nonblocking(true)
            .and_then(|()| fs::symlink_metadata(path))
            .map(|metadata| (metadata.dev(), metadata.ino()));
        match file_identity {
            Ok(file_identity) => Ok(ListeningSocket {
                listener,
                path: path.to_owned(),
                file_identity,
            }),
            Err(source) => {
                // The file was created by the bind above, so it is ours to remove.
                let _ = fs::remove_file(path);
                Err(Error::Bind {
                    path: path.to_owned(),
                    source,
                })
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The next pending connection, or None when there is none left.
    pub(crate) fn accept(&self) -> Result<Option<UnixStream>, Error> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => return Ok(Some(stream)),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                // The client gave up before we accepted it; nothing to serve.
                Err(error) if error.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(Error::Accept {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
    }
}

impl AsFd for ListeningSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Drop for ListeningSocket {
    fn drop(&mut self) {
        // Another server may have replaced the file since (after our socket was reported
        // stale); its socket is not ours to remove.
        let still_ours = fs::symlink_metadata(&self.path)
            .is_ok_and(|metadata| (metadata.dev(), metadata.ino()) == self.file_identity);
        if still_ours {
            // Nothing to do on failure: the next bind sees a stale socket and replaces it.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A socket file nobody listens on is left behind by a killed server; it is replaced. A live
/// one, or any other kind of file, is an error.
fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::ProbeExistingSocket {
                path: path.to_owned(),
                source,
            })
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(Error::PathNotSocket {
            path: path.to_owned(),
        });
    }
    // Connecting is the only check that needs no privileges; a live ivshmem server sees this
    // as a peer that joins and leaves at once.
    match UnixStream::connect(path) {
        Ok(_) => Err(Error::SocketInUse {
            path: path.to_owned(),
        }),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => fs::remove_file(path)
            .map_err(|source| Error::RemoveStaleSocket {
                path: path.to_owned(),
                source,
            }),
        Err(source) => Err(Error::ProbeExistingSocket {
            path: path.to_owned(),
            source,
        }),
    }
}
