//! The server against test clients that speak the client side of QEMU's ivshmem protocol.

mod common;

use std::io::Write;
use std::os::fd::AsFd;

use common::{is_readable, read_counter, ring, Mapping, TestClient, TestDir};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::stat::fstat;
use pcieipc_ivshmem_server::{spawn, ServerConfig};

const SHM_SIZE: u64 = 1 << 20;
const VECTORS: usize = 2;

fn config(dir: &TestDir, max_peers: u16) -> ServerConfig {
    ServerConfig {
        socket_path: dir.socket(),
        shm_size: SHM_SIZE,
        vectors: VECTORS as u16,
        max_peers,
    }
}

#[test]
fn three_peers_get_version_id_shared_memory_and_every_eventfd_in_order() {
    let dir = TestDir::new("three-peers");
    let server = spawn(config(&dir, 8)).unwrap();

    let a = TestClient::connect(&dir.socket());
    let a_setup = a.handshake(0, VECTORS);
    let b = TestClient::connect(&dir.socket());
    let b_setup = b.handshake(1, VECTORS);
    let c = TestClient::connect(&dir.socket());
    let c_setup = c.handshake(2, VECTORS);

    assert_eq!(
        [a_setup.version, b_setup.version, c_setup.version],
        [0, 0, 0]
    );
    assert_eq!([a_setup.id, b_setup.id, c_setup.id], [0, 1, 2]);
    assert_eq!(
        a_setup.peers.keys().copied().collect::<Vec<_>>(),
        Vec::<i64>::new()
    );
    assert_eq!(b_setup.peers.keys().copied().collect::<Vec<_>>(), vec![0]);
    assert_eq!(
        c_setup.peers.keys().copied().collect::<Vec<_>>(),
        vec![0, 1]
    );
    for vectors in b_setup.peers.values().chain(c_setup.peers.values()) {
        assert_eq!(vectors.len(), VECTORS);
    }

    // Arrivals after a client's own setup come as announcements: A hears of B then C, B of C,
    // each once per vector with an fd.
    let mut a_heard = Vec::new();
    for _ in 0..2 * VECTORS {
        let message = a.recv_message();
        a_heard.push((
            message.value,
            message.fd.expect("announcement without an eventfd"),
        ));
    }
    assert_eq!(
        a_heard.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![1, 1, 2, 2]
    );
    let mut b_heard = Vec::new();
    for _ in 0..VECTORS {
        let message = b.recv_message();
        b_heard.push((
            message.value,
            message.fd.expect("announcement without an eventfd"),
        ));
    }
    assert_eq!(
        b_heard.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![2, 2]
    );
    assert!(!a.has_pending_message());
    assert!(!b.has_pending_message());
    assert!(!c.has_pending_message());

    // One memory behind every shm fd: sealed at the configured size, written through one
    // mapping and read through another.
    for shm in [&a_setup.shm, &b_setup.shm, &c_setup.shm] {
        assert_eq!(fstat(shm.as_fd()).unwrap().st_size, SHM_SIZE as i64);
        let seals = SealFlag::from_bits_truncate(fcntl(shm, FcntlArg::F_GET_SEALS).unwrap());
        assert!(
            seals.contains(SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL)
        );
    }
    let a_memory = Mapping::new(&a_setup.shm, SHM_SIZE as usize);
    let c_memory = Mapping::new(&c_setup.shm, SHM_SIZE as usize);
    a_memory.write(4096, b"written by peer 0");
    assert_eq!(c_memory.read(4096, 17), b"written by peer 0");
    c_memory.write(SHM_SIZE as usize - 4, &[1, 2, 3, 4]);
    assert_eq!(a_memory.read(SHM_SIZE as usize - 4, 4), vec![1, 2, 3, 4]);

    // A rings B on vector 1 with A's copy of B's eventfd; B sees it on its own vector 1 only.
    let (_, a_copy_of_b_vector_1) = &a_heard[1];
    ring(a_copy_of_b_vector_1);
    assert!(is_readable(b_setup.own_vectors[1].as_fd()));
    assert!(!is_readable(b_setup.own_vectors[0].as_fd()));
    assert!(!is_readable(a_setup.own_vectors[1].as_fd()));
    assert!(!is_readable(c_setup.own_vectors[1].as_fd()));
    assert_eq!(read_counter(&b_setup.own_vectors[1]), 1);

    // C rings A on vector 0 with the copy it got at connect time.
    ring(&c_setup.peers[&0][0]);
    ring(&c_setup.peers[&0][0]);
    assert!(!is_readable(a_setup.own_vectors[1].as_fd()));
    assert_eq!(read_counter(&a_setup.own_vectors[0]), 2);

    server.shutdown().unwrap();
}

#[test]
fn a_departing_peer_is_announced_without_an_fd_and_its_id_is_reused() {
    let dir = TestDir::new("departure");
    let server = spawn(config(&dir, 8)).unwrap();
    let a = TestClient::connect(&dir.socket());
    a.handshake(0, VECTORS);
    let b = TestClient::connect(&dir.socket());
    b.handshake(1, VECTORS);
    let c = TestClient::connect(&dir.socket());
    let c_setup = c.handshake(2, VECTORS);
    for _ in 0..2 * VECTORS {
        a.recv_message();
    }
    for _ in 0..VECTORS {
        b.recv_message();
    }

    drop(b);
    for survivor in [&a, &c] {
        let notice = survivor.recv_message();
        assert_eq!(notice.value, 1);
        assert!(notice.fd.is_none(), "disconnect notice came with an fd");
    }

    // The lowest free id goes to the next client, which learns of peers 0 and 2 only.
    let d = TestClient::connect(&dir.socket());
    let d_setup = d.handshake(2, VECTORS);
    assert_eq!(d_setup.id, 1);
    assert_eq!(
        d_setup.peers.keys().copied().collect::<Vec<_>>(),
        vec![0, 2]
    );
    // The survivors hear of the newcomer with fresh eventfds that reach it.
    let mut c_copy_of_d = Vec::new();
    for _ in 0..VECTORS {
        let message = c.recv_message();
        assert_eq!(message.value, 1);
        c_copy_of_d.push(message.fd.expect("announcement without an eventfd"));
    }
    ring(&c_copy_of_d[0]);
    assert_eq!(read_counter(&d_setup.own_vectors[0]), 1);
    assert!(!is_readable(c_setup.own_vectors[0].as_fd()));

    server.shutdown().unwrap();
}

#[test]
fn a_client_that_sends_anything_is_disconnected_like_a_departure() {
    let dir = TestDir::new("talker");
    let server = spawn(config(&dir, 8)).unwrap();
    let a = TestClient::connect(&dir.socket());
    a.handshake(0, VECTORS);
    let mut b = TestClient::connect(&dir.socket());
    b.handshake(1, VECTORS);
    for _ in 0..VECTORS {
        a.recv_message();
    }

    // The protocol is one-way; QEMU's server closes a client that writes.
    b.stream.write_all(&7i64.to_le_bytes()).unwrap();
    assert!(b.recv().is_none());
    let notice = a.recv_message();
    assert_eq!(notice.value, 1);
    assert!(notice.fd.is_none());

    server.shutdown().unwrap();
}

#[test]
fn a_client_past_the_peer_limit_gets_an_unusable_version_and_is_closed() {
    let dir = TestDir::new("full");
    let server = spawn(config(&dir, 2)).unwrap();
    let a = TestClient::connect(&dir.socket());
    a.handshake(0, VECTORS);
    let b = TestClient::connect(&dir.socket());
    b.handshake(1, VECTORS);

    let refused = TestClient::connect(&dir.socket());
    let version = refused.recv_message();
    assert_eq!(version.value, i64::MAX);
    assert!(version.fd.is_none());
    assert!(
        refused.recv().is_none(),
        "a refused client got more than the version"
    );
    // The peers were not told about it.
    for _ in 0..VECTORS {
        assert_eq!(a.recv_message().value, 1);
    }
    assert!(!a.has_pending_message());
    assert!(!b.has_pending_message());

    // A freed id makes room again.
    drop(a);
    assert_eq!(b.recv_message().value, 0);
    let c = TestClient::connect(&dir.socket());
    assert_eq!(c.handshake(1, VECTORS).id, 0);

    server.shutdown().unwrap();
}

#[test]
fn shutdown_tells_the_remaining_peers_closes_them_and_removes_the_socket() {
    let dir = TestDir::new("shutdown");
    let server = spawn(config(&dir, 8)).unwrap();
    let a = TestClient::connect(&dir.socket());
    a.handshake(0, VECTORS);
    let b = TestClient::connect(&dir.socket());
    b.handshake(1, VECTORS);
    for _ in 0..VECTORS {
        a.recv_message();
    }

    server.shutdown().unwrap();

    assert!(!dir.socket().exists());
    // Peers are closed in id order, each departure told to those still connected.
    assert!(a.recv().is_none());
    let notice = b.recv_message();
    assert_eq!(notice.value, 0);
    assert!(notice.fd.is_none());
    assert!(b.recv().is_none());
}

#[test]
fn dropping_the_running_server_removes_the_socket() {
    let dir = TestDir::new("drop");
    let server = spawn(config(&dir, 8)).unwrap();
    assert_eq!(server.socket_path(), dir.socket());
    assert!(dir.socket().exists());
    drop(server);
    assert!(!dir.socket().exists());
}
