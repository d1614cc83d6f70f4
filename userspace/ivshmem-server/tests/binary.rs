//! The pcieipc-ivshmem-server binary: serves until SIGTERM or SIGINT, then removes its socket;
//! refuses bad flags with a message.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestClient, TestDir};
use nix::sys::signal::{kill, Signal};
use nix::sys::stat::fstat;
use nix::unistd::Pid;

const BINARY: &str = env!("CARGO_BIN_EXE_pcieipc-ivshmem-server");

fn start(dir: &TestDir, size: &str, vectors: &str) -> Child {
    Command::new(BINARY)
        .args([
            "--socket",
            dir.socket().to_str().unwrap(),
            "--size",
            size,
            "--vectors",
            vectors,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the exit status, killing the server if it outlives `timeout`.
fn wait_exit(mut child: Child, timeout: Duration) -> std::process::Output {
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!(
                "server did not exit within {timeout:?}: {:?}",
                child.wait_with_output()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn serves_then_stops_on(signal: Signal, name: &str) {
    let dir = TestDir::new(name);
    let child = start(&dir, "4M", "3");
    let client = TestClient::connect_when_listening(&dir.socket());
    let setup = client.handshake(0, 3);
    assert_eq!(setup.version, 0);
    assert_eq!(setup.id, 0);
    assert_eq!(fstat(&setup.shm).unwrap().st_size, 4 << 20);

    kill(Pid::from_raw(child.id() as i32), signal).unwrap();
    let output = wait_exit(child, Duration::from_secs(10));
    assert!(output.status.success(), "{output:?}");
    assert!(!dir.socket().exists());
    assert!(client.recv().is_none());
}

#[test]
fn serves_until_sigterm_then_removes_the_socket() {
    serves_then_stops_on(Signal::SIGTERM, "bin-term");
}

#[test]
fn serves_until_sigint_then_removes_the_socket() {
    serves_then_stops_on(Signal::SIGINT, "bin-int");
}

#[test]
fn a_size_that_is_not_a_power_of_two_exits_with_the_reason() {
    let dir = TestDir::new("bin-bad-size");
    let output = wait_exit(start(&dir, "3M", "1"), Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("shared memory size 3145728 is not a power of two"),
        "{stderr}"
    );
    assert!(!dir.socket().exists());
}

#[test]
fn unparsable_size_text_is_refused_by_the_flag_parser() {
    let dir = TestDir::new("bin-bad-text");
    let output = wait_exit(start(&dir, "4T", "1"), Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("invalid size \"4T\""), "{stderr}");
}

#[test]
fn zero_vectors_exits_with_the_reason() {
    let dir = TestDir::new("bin-zero-vectors");
    let output = wait_exit(start(&dir, "1M", "0"), Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("0 interrupt vectors per peer requested"),
        "{stderr}"
    );
}
