//! Alone in its binary: it counts this process's fds, which other tests running in parallel
//! threads would change.

mod common;

use common::{open_fd_count, Mapping, TestClient, TestDir};
use pcieipc_ivshmem_server::{spawn, ServerConfig};

#[test]
fn a_server_that_served_peers_leaves_no_fd_and_no_socket_behind() {
    let dir = TestDir::new("fd-leak");
    let before = open_fd_count();

    let server = spawn(ServerConfig {
        socket_path: dir.socket(),
        shm_size: 1 << 16,
        vectors: 4,
        max_peers: 2,
    })
    .unwrap();
    {
        let a = TestClient::connect(&dir.socket());
        let a_setup = a.handshake(0, 4);
        let b = TestClient::connect(&dir.socket());
        b.handshake(1, 4);
        let refused = TestClient::connect(&dir.socket());
        assert_eq!(refused.recv_message().value, i64::MAX);
        assert!(refused.recv().is_none());
        let memory = Mapping::new(&a_setup.shm, 1 << 16);
        memory.write(0, b"x");
        drop(b);
        assert_eq!(a.recv_message().value, 1);
        assert!(open_fd_count() > before);
    }
    server.shutdown().unwrap();

    assert_eq!(open_fd_count(), before);
    assert!(!dir.socket().exists());
}
