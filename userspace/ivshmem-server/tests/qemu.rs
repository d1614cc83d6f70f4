//! The server against QEMU's own ivshmem-doorbell device, driven through qtest (no guest): the
//! device must realize on what the server sends, ring the right peer, and take a refusal.
//! QEMU is $PCIEIPC_QEMU (set by scripts/setup-host.sh), else qemu-system-x86_64 on PATH; a
//! missing QEMU fails these tests.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{is_readable, read_counter, TestClient, TestDir, RECV_TIMEOUT};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use pcieipc_ivshmem_server::{spawn, ServerConfig};

const VECTORS: u16 = 2;
/// PCI slot given to the device on the command line, so the test knows where to find it.
const IVSHMEM_SLOT: u32 = 5;
/// Guest-physical address the test assigns to BAR0 (registers).
const BAR0_ADDRESS: u32 = 0xfe00_0000;
/// BAR0 register offsets from docs/specs/ivshmem-spec.rst.
const IV_POSITION: u32 = 8;
const DOORBELL: u32 = 12;

/// A QEMU process killed and reaped when dropped, so a failing test leaves none behind.
struct Qemu {
    child: Child,
    stderr_path: std::path::PathBuf,
}

impl Qemu {
    fn start(dir: &TestDir, ivshmem_socket: &Path, qtest_socket: &Path) -> Qemu {
        let binary =
            std::env::var("PCIEIPC_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".to_owned());
        let stderr_path = dir.path.join("qemu.stderr");
        let mut command = Command::new(&binary);
        if let Ok(firmware) = std::env::var("PCIEIPC_QEMU_FIRMWARE") {
            command.args(["-L", &firmware]);
        }
        command
            // -S: QEMU 10 runs the firmware beside qtest, and SeaBIOS would reassign BAR0
            // under the test.
            .args(["-M", "q35", "-S", "-display", "none", "-nodefaults"])
            .arg("-qtest")
            .arg(format!("unix:{}", qtest_socket.display()))
            .arg("-chardev")
            .arg(format!("socket,path={},id=ivs0", ivshmem_socket.display()))
            .arg("-device")
            .arg(format!(
                "ivshmem-doorbell,chardev=ivs0,vectors={VECTORS},addr={IVSHMEM_SLOT:02x}.0"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr_path).unwrap());
        let child = command.spawn().unwrap_or_else(|error| {
            panic!(
                "cannot run QEMU {binary:?}: {error}; run scripts/setup-host.sh and source \
                 its env.sh, or put qemu-system-x86_64 on PATH"
            )
        });
        Qemu { child, stderr_path }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits for QEMU to exit by itself and returns its exit code.
    fn wait_exit(&mut self) -> Option<i32> {
        let deadline = std::time::Instant::now() + RECV_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "QEMU did not exit: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The qtest line protocol: one command per line, answered by a line starting with OK.
struct Qtest {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qtest {
    fn accept(listener: &UnixListener, qemu: &Qemu) -> Qtest {
        let mut poll_fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(RECV_TIMEOUT).unwrap();
        let ready = poll(&mut poll_fds, timeout).unwrap();
        assert_eq!(
            ready,
            1,
            "QEMU never connected its qtest socket: {}",
            qemu.stderr()
        );
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
        Qtest {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    /// Sends `command` and returns the value after OK, if any ("" for a bare OK).
    fn command(&mut self, command: &str) -> String {
        writeln!(self.writer, "{command}").unwrap();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            // Asynchronous lines (IRQ ...) may come before the answer.
            if let Some(rest) = line.strip_prefix("OK") {
                return rest.trim().to_owned();
            }
            assert!(
                !line.starts_with("ERR") && !line.starts_with("FAIL"),
                "{command}: {line}"
            );
            assert!(!line.is_empty(), "{command}: qtest connection closed");
        }
    }

    fn pci_config_address(register: u32) -> u32 {
        0x8000_0000 | (IVSHMEM_SLOT << 11) | register
    }

    fn pci_config_read(&mut self, register: u32) -> u64 {
        self.command(&format!(
            "outl 0xcf8 {:#x}",
            Self::pci_config_address(register)
        ));
        parse_hex(&self.command("inl 0xcfc"))
    }

    fn pci_config_write32(&mut self, register: u32, value: u32) {
        self.command(&format!(
            "outl 0xcf8 {:#x}",
            Self::pci_config_address(register)
        ));
        self.command(&format!("outl 0xcfc {value:#x}"));
    }

    /// For 16-bit registers such as Command, so the write leaves its neighbour alone.
    fn pci_config_write16(&mut self, register: u32, value: u16) {
        self.command(&format!(
            "outl 0xcf8 {:#x}",
            Self::pci_config_address(register)
        ));
        self.command(&format!("outw 0xcfc {value:#x}"));
    }
}

fn parse_hex(text: &str) -> u64 {
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .unwrap_or_else(|_| panic!("not hex: {text:?}"))
}

#[test]
fn qemu_realizes_on_the_server_and_its_doorbell_rings_the_right_peer() {
    let dir = TestDir::new("qemu-doorbell");
    let server = spawn(ServerConfig {
        socket_path: dir.socket(),
        shm_size: 1 << 20,
        vectors: VECTORS,
        max_peers: 8,
    })
    .unwrap();
    let peer0 = TestClient::connect(&dir.socket());
    let peer0_setup = peer0.handshake(0, usize::from(VECTORS));

    let qtest_socket = dir.path.join("qtest.sock");
    let listener = UnixListener::bind(&qtest_socket).unwrap();
    let qemu = Qemu::start(&dir, &dir.socket(), &qtest_socket);
    let mut qtest = Qtest::accept(&listener, &qemu);

    // QEMU became peer 1 and peer 0 heard of it.
    for _ in 0..VECTORS {
        let announcement = peer0.recv_message();
        assert_eq!(announcement.value, 1);
        assert!(announcement.fd.is_some());
    }

    // Vendor 1af4, device 1110: the ivshmem device, realized.
    assert_eq!(qtest.pci_config_read(0x00), 0x1110_1af4);
    qtest.pci_config_write32(0x10, BAR0_ADDRESS);
    qtest.pci_config_write16(0x04, 0x2); // memory space enable
    assert_eq!(
        parse_hex(&qtest.command(&format!("readl {:#x}", BAR0_ADDRESS + IV_POSITION))),
        1
    );

    // Doorbell: peer 0 in bits 16..31, vector 1 in bits 0..15.
    qtest.command(&format!("writel {:#x} 0x00000001", BAR0_ADDRESS + DOORBELL));
    assert!(is_readable(peer0_setup.own_vectors[1].as_fd()));
    assert!(!is_readable(peer0_setup.own_vectors[0].as_fd()));
    assert_eq!(read_counter(&peer0_setup.own_vectors[1]), 1);

    drop(qtest);
    drop(qemu);
    let notice = peer0.recv_message();
    assert_eq!(notice.value, 1);
    assert!(notice.fd.is_none());
    server.shutdown().unwrap();
}

#[test]
fn qemu_past_the_peer_limit_fails_with_the_version_message() {
    let dir = TestDir::new("qemu-refused");
    let server = spawn(ServerConfig {
        socket_path: dir.socket(),
        shm_size: 1 << 20,
        vectors: VECTORS,
        max_peers: 1,
    })
    .unwrap();
    let peer0 = TestClient::connect(&dir.socket());
    peer0.handshake(0, usize::from(VECTORS));

    let qtest_socket = dir.path.join("qtest.sock");
    let _listener = UnixListener::bind(&qtest_socket).unwrap();
    let mut qemu = Qemu::start(&dir, &dir.socket(), &qtest_socket);
    assert_eq!(qemu.wait_exit(), Some(1));
    assert!(
        qemu.stderr()
            .contains("server sent version 9223372036854775807, expecting 0"),
        "{}",
        qemu.stderr()
    );
    assert!(!peer0.has_pending_message());
    server.shutdown().unwrap();
}
