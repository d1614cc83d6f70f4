//! spawn's refusals: bad configuration and socket paths it must not or cannot use.

mod common;

use std::fs;
use std::os::unix::net::UnixListener;

use common::{TestClient, TestDir};
use pcieipc_ivshmem_server::{spawn, Error, ServerConfig};

fn config(dir: &TestDir, shm_size: u64, vectors: u16, max_peers: u16) -> ServerConfig {
    ServerConfig {
        socket_path: dir.socket(),
        shm_size,
        vectors,
        max_peers,
    }
}

fn spawn_error(config: ServerConfig) -> Error {
    match spawn(config) {
        Ok(_) => panic!("spawn accepted a configuration it must refuse"),
        Err(error) => error,
    }
}

#[test]
fn malformed_configurations_are_refused_before_the_socket_exists() {
    let dir = TestDir::new("bad-config");
    let error = spawn_error(config(&dir, 0, 1, 8));
    assert!(
        matches!(error, Error::ShmSizeNotPowerOfTwo { size: 0 }),
        "{error:?}"
    );
    let error = spawn_error(config(&dir, 3 << 20, 1, 8));
    assert!(
        matches!(error, Error::ShmSizeNotPowerOfTwo { size: 3_145_728 }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "shared memory size 3145728 is not a power of two \
         (QEMU maps it as a PCI BAR, and BAR sizes are powers of two)"
    );
    let error = spawn_error(config(&dir, 1 << 20, 0, 8));
    assert!(
        matches!(
            error,
            Error::VectorCountOutOfRange {
                vectors: 0,
                max: 64
            }
        ),
        "{error:?}"
    );
    let error = spawn_error(config(&dir, 1 << 20, 1, 0));
    assert!(matches!(error, Error::MaxPeersZero), "{error:?}");
    assert!(!dir.socket().exists());
}

#[test]
fn a_missing_socket_directory_is_named_in_the_error() {
    let dir = TestDir::new("missing-dir");
    let socket_path = dir.path.join("absent").join("ivshmem.sock");
    let error = spawn_error(ServerConfig {
        socket_path: socket_path.clone(),
        shm_size: 1 << 20,
        vectors: 1,
        max_peers: 8,
    });
    match &error {
        Error::SocketDirMissing { path } => assert_eq!(path, &socket_path),
        other => panic!("expected SocketDirMissing, got {other:?}"),
    }
    assert_eq!(
        error.to_string(),
        format!(
            "{}: the directory for the socket does not exist",
            socket_path.display()
        )
    );
}

#[test]
fn a_live_server_on_the_path_is_not_replaced() {
    let dir = TestDir::new("live");
    let first = spawn(config(&dir, 1 << 20, 1, 8)).unwrap();
    match spawn_error(config(&dir, 1 << 20, 1, 8)) {
        Error::SocketInUse { path } => assert_eq!(path, dir.socket()),
        other => panic!("expected SocketInUse, got {other:?}"),
    }
    // The first server still serves on its socket.
    let client = TestClient::connect(&dir.socket());
    assert_eq!(client.handshake(0, 1).id, 0);
    first.shutdown().unwrap();
}

#[test]
fn a_stale_socket_left_by_a_dead_server_is_replaced() {
    let dir = TestDir::new("stale");
    // Dropping a std listener closes it but leaves its file, as a killed server does.
    drop(UnixListener::bind(dir.socket()).unwrap());
    assert!(dir.socket().exists());
    let server = spawn(config(&dir, 1 << 20, 1, 8)).unwrap();
    let client = TestClient::connect(&dir.socket());
    assert_eq!(client.handshake(0, 1).version, 0);
    server.shutdown().unwrap();
    assert!(!dir.socket().exists());
}

#[test]
fn a_file_that_is_not_a_socket_is_left_alone() {
    let dir = TestDir::new("not-socket");
    fs::write(dir.socket(), b"keep me").unwrap();
    match spawn_error(config(&dir, 1 << 20, 1, 8)) {
        Error::PathNotSocket { path } => assert_eq!(path, dir.socket()),
        other => panic!("expected PathNotSocket, got {other:?}"),
    }
    assert_eq!(fs::read(dir.socket()).unwrap(), b"keep me");
}
