//! One testbed run: ivshmem servers, initramfs, QEMU, the host control
//! channel, the time limit, and the verdict.

use std::{
    io::{BufRead, BufReader, Read, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use pcieipc_ivshmem_server::{RunningServer, ServerConfig, DEFAULT_MAX_PEERS};
use serde_json::json;

use crate::{
    fabric::{self, Fabric},
    initramfs::{self, InitramfsError, MARK_DMESG_BEGIN, MARK_DMESG_END, MARK_EXIT, MARK_START},
    qmp::{Qmp, QmpError},
    topology::{Topology, TopologyError, Vm},
};

/// Default time limit of a run when neither the topology nor the caller sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long QEMU may take to connect its control sockets after it starts.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a hot-unplug may take before the host reports failure.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(15);
/// How long QEMU's monitor may take to answer the liveness question asked
/// when a run times out.
const MONITOR_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Patterns in the guest kernel log that fail a run whatever the guest said.
const KERNEL_LOG_FAILURES: [&str; 9] = [
    "WARNING:",
    "BUG:",
    "Oops",
    "KASAN",
    "UBSAN",
    "general protection fault",
    "Kernel panic",
    "Call Trace:",
    "panicked at",
];

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub topology: PathBuf,
    pub guest_script: PathBuf,
    pub kernel: PathBuf,
    pub module: Option<PathBuf>,
    /// Programs copied to the guest's /bin, with their shared libraries.
    pub binaries: Vec<PathBuf>,
    /// A script run on the host during the guest's run, with
    /// PCIEIPC_TESTBED_QMP naming a QMP socket it may use.
    pub host_script: Option<PathBuf>,
    pub qemu: PathBuf,
    pub firmware_dirs: Vec<PathBuf>,
    pub timeout: Option<Duration>,
    /// QEMU arguments after the harness's own.
    pub extra_qemu_args: Vec<String>,
    /// What of the guest console to echo as it arrives.
    pub echo: Echo,
}

/// What of the guest console a run echoes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Echo {
    Nothing,
    All,
    /// Everything but the guest's kernel log dump at its end (a run that
    /// keeps the console elsewhere shows the dump only when it failed).
    AllButKernelLog,
}

impl Echo {
    /// Whether the console's next `line` is echoed; `in_kernel_log` follows
    /// the dump's markers from line to line.
    fn shows(self, line: &str, in_kernel_log: &mut bool) -> bool {
        *in_kernel_log |= line.contains(MARK_DMESG_BEGIN);
        let shown = match self {
            Echo::Nothing => false,
            Echo::All => true,
            Echo::AllButKernelLog => !*in_kernel_log,
        };
        *in_kernel_log &= !line.contains(MARK_DMESG_END);
        shown
    }
}

#[derive(Debug)]
pub struct RunOutcome {
    pub guest_exit: i32,
    pub console: Vec<String>,
    /// Lines of the guest kernel log that match KERNEL_LOG_FAILURES.
    pub kernel_log_failures: Vec<String>,
}

impl RunOutcome {
    pub fn passed(&self) -> bool {
        self.guest_exit == 0 && self.kernel_log_failures.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("{path}: {what} not found")]
    Missing { path: PathBuf, what: &'static str },
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    #[error("ivshmem server for region {region:?}: {source}")]
    Ivshmem {
        region: String,
        source: pcieipc_ivshmem_server::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("QEMU ({qemu}) could not start: {source}")]
    QemuSpawn {
        qemu: PathBuf,
        source: std::io::Error,
    },
    #[error("QEMU exited ({status}) before the guest finished; QEMU said:\n{stderr}\nlast console lines:\n{tail}")]
    QemuExited {
        status: String,
        stderr: String,
        tail: String,
        /// Whether the guest's /init had begun (its start marker was on
        /// the console).
        guest_started: bool,
    },
    #[error(
        "QEMU did not connect its {what} socket within {CONNECT_TIMEOUT:?}; QEMU said:\n{stderr}"
    )]
    NoConnection { what: &'static str, stderr: String },
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error(
        "the guest did not finish within {limit:?}: QEMU was killed; {diagnosis}; QEMU said:\n{stderr}\nlast console lines:\n{tail}"
    )]
    Timeout {
        limit: Duration,
        /// Who was stuck: the host request in flight, and whether QEMU's
        /// monitor still answered; for a guest whose /init never began, the
        /// vCPU's state as QEMU's monitor gives it (`info status`,
        /// `info registers`).
        diagnosis: String,
        tail: String,
        stderr: String,
        /// Whether the guest's /init had begun.
        guest_started: bool,
    },
    #[error("host script {path} failed: {status}")]
    HostScript { path: PathBuf, status: String },
}

/// Runs the guest, and boots it once more when its kernel died, or went
/// silent until the time limit, before the guest's /init began. Nothing of
/// this project had run by then: the module, the guest script and the host
/// script all start from /init. Debian's kernel under TCG died that way once
/// in CI (an `int3` trap in `sched_clock_cpu` while the kernel unpacked the
/// initramfs), and the testbed's kernel once printed nothing for 120 s while
/// QEMU ran, which says nothing about the code under test; the first boot's
/// evidence is printed, and a second failure fails the run.
pub fn run(config: &RunConfig) -> Result<RunOutcome, RunError> {
    match run_once(config) {
        Err(error) if failed_before_init(&error) => {
            eprintln!(
                "pcieipc-testbed: the guest's kernel {} before its /init began, so none of the \
                 run's code had run; booting it once more. The first boot:\n{error}",
                match error {
                    RunError::Timeout { .. } => "went silent",
                    _ => "died",
                }
            );
            run_once(config)
        }
        other => other,
    }
}

fn failed_before_init(error: &RunError) -> bool {
    // A QEMU that refused its arguments exits before any boot too, and
    // would only refuse them again: only a kernel's death or silence is
    // booted anew.
    matches!(
        error,
        RunError::QemuExited {
            guest_started: false,
            tail,
            ..
        } if tail.contains("Kernel panic")
    ) || matches!(
        error,
        RunError::Timeout {
            guest_started: false,
            ..
        }
    )
}

fn run_once(config: &RunConfig) -> Result<RunOutcome, RunError> {
    let topology = Topology::load(&config.topology)?;
    let topology_text =
        std::fs::read_to_string(&config.topology).map_err(|source| RunError::Io {
            path: config.topology.clone(),
            source,
        })?;
    for (path, what) in [
        (&config.guest_script, "guest script"),
        (&config.kernel, "kernel image"),
    ] {
        if !path.is_file() {
            return Err(RunError::Missing {
                path: path.clone(),
                what,
            });
        }
    }
    if let Some(module) = &config.module {
        if !module.is_file() {
            return Err(RunError::Missing {
                path: module.clone(),
                what: "kernel module",
            });
        }
    }
    let fabric = fabric::lay_out(&topology);
    let work = WorkDir::create()?;

    let servers = start_ivshmem_servers(&topology, work.path())?;
    let initrd = work.path().join("initramfs.cpio");
    initramfs::build(
        &initramfs::Contents {
            guest_script: &config.guest_script,
            module: config.module.as_deref(),
            binaries: &config.binaries,
            expected_tree: &fabric.expected_tree,
            topology_text: &topology_text,
        },
        &work.path().join("initramfs"),
        &initrd,
    )?;

    let control_path = work.path().join("hostctl.sock");
    let qmp_path = work.path().join("qmp.sock");
    let host_qmp_path = work.path().join("qmp-host.sock");
    let control_listener = bind(&control_path)?;
    let qmp_listener = bind(&qmp_path)?;

    let args = qemu_args(
        config,
        &fabric,
        &servers,
        &initrd,
        &topology.vm,
        &control_path,
        &qmp_path,
        &host_qmp_path,
    );
    let mut qemu = Command::new(&config.qemu)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RunError::QemuSpawn {
            qemu: config.qemu.clone(),
            source,
        })?;
    let guard = KillOnDrop(&mut qemu);
    let result = supervise(
        config,
        &topology,
        guard,
        control_listener,
        qmp_listener,
        &host_qmp_path,
    );
    drop(servers);
    result
}

/// One ivshmem server per region, listening in the work directory.
fn start_ivshmem_servers(
    topology: &Topology,
    dir: &Path,
) -> Result<Vec<(String, RunningServer)>, RunError> {
    topology
        .regions
        .iter()
        .map(|region| {
            let config = ServerConfig {
                socket_path: dir.join(format!("ivshmem-{}.sock", region.id)),
                shm_size: pcieipc_ivshmem_server::parse_size(&region.size).map_err(|source| {
                    RunError::Ivshmem {
                        region: region.id.clone(),
                        source,
                    }
                })?,
                vectors: region.vectors,
                max_peers: DEFAULT_MAX_PEERS,
            };
            let server =
                pcieipc_ivshmem_server::spawn(config).map_err(|source| RunError::Ivshmem {
                    region: region.id.clone(),
                    source,
                })?;
            Ok((region.id.clone(), server))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn qemu_args(
    config: &RunConfig,
    fabric: &Fabric,
    servers: &[(String, RunningServer)],
    initrd: &Path,
    vm: &Vm,
    control: &Path,
    qmp: &Path,
    host_qmp: &Path,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "-accel",
        "tcg",
        "-M",
        "q35",
        "-cpu",
        "max",
        "-smp",
        "2",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        "stdio",
    ]
    .map(String::from)
    .to_vec();
    args.push("-m".into());
    args.push(vm.memory_mib.unwrap_or(512).to_string());
    // ttyS1: the guest's requests to the harness (QEMU connects to our listener).
    args.push("-serial".into());
    args.push(format!("unix:{}", control.display()));
    args.push("-chardev".into());
    args.push(format!("socket,id=harness-qmp,path={}", qmp.display()));
    args.push("-mon".into());
    args.push("chardev=harness-qmp,mode=control".into());
    args.push("-qmp".into());
    args.push(format!("unix:{},server=on,wait=off", host_qmp.display()));
    for dir in &config.firmware_dirs {
        args.push("-L".into());
        args.push(dir.display().to_string());
    }
    args.push("-kernel".into());
    args.push(config.kernel.display().to_string());
    args.push("-initrd".into());
    args.push(initrd.display().to_string());
    args.push("-append".into());
    // loglevel=4 keeps routine kernel messages off the console (the guest
    // dumps the whole log at the end).
    let mut cmdline = "console=ttyS0 loglevel=4 panic=-1".to_string();
    if let Some(extra) = &vm.kernel_args {
        cmdline = format!("{cmdline} {extra}");
    }
    args.push(cmdline);
    // Native PCIe hotplug (pciehp) rather than q35's ACPI hotplug, so that
    // _OSC hands hotplug to the kernel like on a real server's root ports.
    args.push("-global".into());
    args.push("ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off".into());
    for (endpoint, region) in &fabric.ivshmem {
        let socket = servers
            .iter()
            .find(|(id, _)| id == region)
            .map(|(_, s)| s.socket_path().to_path_buf());
        if let Some(socket) = socket {
            args.push("-chardev".into());
            args.push(format!(
                "socket,id={},path={}",
                fabric::chardev_id(endpoint),
                socket.display()
            ));
        }
    }
    for device in &fabric.devices {
        args.push("-device".into());
        args.push(device.clone());
    }
    args.extend(config.extra_qemu_args.iter().cloned());
    args
}

fn supervise(
    config: &RunConfig,
    topology: &Topology,
    mut qemu: KillOnDrop<'_>,
    control_listener: UnixListener,
    qmp_listener: UnixListener,
    host_qmp: &Path,
) -> Result<RunOutcome, RunError> {
    let stdout = qemu.0.stdout.take().expect("stdout is piped");
    let stderr = qemu.0.stderr.take().expect("stderr is piped");
    let stderr_reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    let (console_tx, console_rx) = mpsc::channel::<String>();
    let echo = config.echo;
    thread::spawn(move || {
        let mut in_kernel_log = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if echo.shows(&line, &mut in_kernel_log) {
                println!("{line}");
            }
            if console_tx.send(line).is_err() {
                break;
            }
        }
    });

    let qemu_failed = |qemu: &mut KillOnDrop<'_>,
                       stderr_reader: thread::JoinHandle<String>,
                       console: &[String]| {
        let status = qemu
            .0
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        RunError::QemuExited {
            status,
            stderr: stderr_reader.join().unwrap_or_default(),
            tail: tail(console),
            guest_started: console.iter().any(|line| line.contains(MARK_START)),
        }
    };
    let qmp_stream = match accept(&qmp_listener, &mut qemu) {
        Some(stream) => stream,
        None => {
            return Err(RunError::NoConnection {
                what: "QMP",
                stderr: stop_and_collect(&mut qemu, stderr_reader),
            })
        }
    };
    let mut qmp = match Qmp::handshake(qmp_stream) {
        Ok(qmp) => qmp,
        // QEMU usually drops QMP because it refused its arguments: show why.
        Err(err) => return Err(qemu_failed(&mut qemu, stderr_reader, &[format!("({err})")])),
    };
    let control = match accept(&control_listener, &mut qemu) {
        Some(stream) => stream,
        None => {
            return Err(RunError::NoConnection {
                what: "host control (ttyS1)",
                stderr: stop_and_collect(&mut qemu, stderr_reader),
            })
        }
    };
    let in_flight: InFlight = Arc::default();
    let control_thread = {
        let in_flight = Arc::clone(&in_flight);
        thread::spawn(move || serve_control(control, &mut qmp, &in_flight))
    };

    let mut host_script = match &config.host_script {
        Some(path) => Some((
            path.clone(),
            Command::new("sh")
                .arg(path)
                .env("PCIEIPC_TESTBED_QMP", host_qmp)
                .spawn()
                .map_err(|source| RunError::Io {
                    path: path.clone(),
                    source,
                })?,
        )),
        None => None,
    };

    let limit = config
        .timeout
        .or(topology.vm.timeout_s.map(Duration::from_secs))
        .unwrap_or(DEFAULT_TIMEOUT);
    let deadline = Instant::now() + limit;
    let mut console = Vec::new();
    let mut guest_exit = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match console_rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(code) = line.split(MARK_EXIT).nth(1) {
                    guest_exit = code.trim().parse::<i32>().ok();
                }
                console.push(line);
                if guest_exit.is_some() {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let guest_started = console.iter().any(|line| line.contains(MARK_START));
                let diagnosis = diagnose_timeout(&in_flight, host_qmp, guest_started);
                let stderr = stop_and_collect(&mut qemu, stderr_reader);
                // What the console held when QEMU died, an unended last line
                // included (the reader sends it at the end of QEMU's output):
                // a guest that hung mid-line shows that line.
                while let Ok(line) = console_rx.recv_timeout(CONSOLE_DRAIN) {
                    console.push(line);
                }
                return Err(RunError::Timeout {
                    limit,
                    diagnosis,
                    tail: tail(&console),
                    stderr,
                    guest_started,
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(qemu_failed(&mut qemu, stderr_reader, &console));
            }
        }
    }
    // The guest powers off right after its exit marker.
    if wait_with_timeout(qemu.0, Duration::from_secs(10)).is_none() {
        let _ = qemu.0.kill();
    }
    let _ = control_thread.join();
    if let Some((path, mut child)) = host_script.take() {
        let status = match wait_with_timeout(&mut child, Duration::from_secs(10)) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                child.wait().map_err(|source| RunError::Io {
                    path: path.clone(),
                    source,
                })?
            }
        };
        if !status.success() {
            return Err(RunError::HostScript {
                path,
                status: status.to_string(),
            });
        }
    }
    let started = console.iter().any(|l| l.contains(MARK_START));
    let kernel_log_failures = kernel_log_failures(&console);
    Ok(RunOutcome {
        guest_exit: guest_exit.filter(|_| started).unwrap_or(-1),
        console,
        kernel_log_failures,
    })
}

/// The guest's dmesg dump in `console`, if it finished one.
pub fn kernel_log(console: &[String]) -> Option<&[String]> {
    let begin = console.iter().position(|l| l.contains(MARK_DMESG_BEGIN));
    let end = console.iter().position(|l| l.contains(MARK_DMESG_END));
    match (begin, end) {
        (Some(b), Some(e)) if b < e => Some(&console[b + 1..e]),
        _ => None,
    }
}

/// Lines of the guest's dmesg dump that show a kernel problem.
fn kernel_log_failures(console: &[String]) -> Vec<String> {
    // No dump: judge the whole console, which carries the kernel's warnings
    // too (loglevel=4).
    kernel_log(console)
        .unwrap_or(console)
        .iter()
        .filter(|line| KERNEL_LOG_FAILURES.iter().any(|p| line.contains(p)))
        .cloned()
        .collect()
}

/// Answers the guest's requests on ttyS1, one line each way, until the
/// guest side closes.
/// How long, after QEMU was killed, the console's last lines may take to
/// arrive.
const CONSOLE_DRAIN: Duration = Duration::from_secs(2);

/// The guest's request the harness is serving, and since when.
type InFlight = Arc<Mutex<Option<(String, Instant)>>>;

/// Says, for a run that timed out, whether the harness was waiting on QEMU for
/// a guest's request and whether QEMU's monitor still answers: a stuck QEMU
/// and a stuck guest look the same on the console. For a guest whose /init
/// never began (a kernel silent from boot), also where its vCPU is: QEMU's
/// `info status` and `info registers`.
fn diagnose_timeout(in_flight: &InFlight, host_qmp: &Path, guest_started: bool) -> String {
    let request = match &*in_flight.lock().unwrap_or_else(|e| e.into_inner()) {
        Some((request, since)) => format!(
            "the guest's request `{request}` was waiting on QEMU for {:.0?}",
            since.elapsed()
        ),
        None => "no request of the guest was waiting on QEMU".to_string(),
    };
    let mut qmp = match Qmp::connect_with_timeout(host_qmp, MONITOR_PROBE_TIMEOUT) {
        Ok(qmp) => qmp,
        Err(err) => {
            return format!(
                "{request}; QEMU's monitor did not answer within {MONITOR_PROBE_TIMEOUT:?} ({err})"
            )
        }
    };
    let monitor = match qmp.execute("query-status", json!({})) {
        Ok(status) => format!(
            "QEMU's monitor answered (status {})",
            status.get("status").and_then(|s| s.as_str()).unwrap_or("?")
        ),
        Err(err) => {
            format!("QEMU's monitor did not answer within {MONITOR_PROBE_TIMEOUT:?} ({err})")
        }
    };
    if guest_started {
        return format!("{request}; {monitor}");
    }
    let evidence = ["info status", "info registers"]
        .map(|command| match qmp.hmp(command) {
            Ok(text) => format!("QEMU's `{command}`:\n{}", text.trim_end()),
            Err(err) => format!("QEMU's `{command}` failed: {err}"),
        })
        .join("\n");
    format!("{request}; {monitor}; the guest printed nothing of its /init:\n{evidence}\n")
}

fn serve_control(stream: UnixStream, qmp: &mut Qmp, in_flight: &InFlight) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let reader = BufReader::new(stream);
    for line in reader.split(b'\n').map_while(Result::ok) {
        let request = String::from_utf8_lossy(&line).trim().to_string();
        if request.is_empty() {
            continue;
        }
        *in_flight.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((request.clone(), Instant::now()));
        let answer = handle_request(&request, qmp);
        *in_flight.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let reply = match answer {
            Ok(text) => format!("ok {}", text.replace(['\r', '\n'], " ").trim()),
            Err(text) => format!("err {}", text.replace(['\r', '\n'], " ")),
        };
        if writer.write_all(format!("{reply}\n").as_bytes()).is_err() {
            break;
        }
    }
}

fn handle_request(request: &str, qmp: &mut Qmp) -> Result<String, String> {
    let (verb, rest) = request.split_once(' ').unwrap_or((request, ""));
    match verb {
        "hmp" => qmp.hmp(rest).map_err(|e| e.to_string()),
        "unplug" => {
            qmp.execute("device_del", json!({ "id": rest }))
                .map_err(|e| e.to_string())?;
            qmp.wait_event("DEVICE_DELETED", Some(rest), UNPLUG_TIMEOUT)
                .map(|_| format!("{rest} removed"))
                .map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "unknown request {verb:?}: use `hmp COMMAND` or `unplug DEVICE-ID`"
        )),
    }
}

fn bind(path: &Path) -> Result<UnixListener, RunError> {
    UnixListener::bind(path).map_err(|source| RunError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Accepts QEMU's connection, giving up when QEMU exits or time runs out.
fn accept(listener: &UnixListener, qemu: &mut KillOnDrop<'_>) -> Option<UnixStream> {
    listener.set_nonblocking(true).ok()?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).ok()?;
                return Some(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if matches!(qemu.0.try_wait(), Ok(Some(_))) {
                    return None;
                }
                thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return None,
        }
    }
    None
}

fn stop_and_collect(
    qemu: &mut KillOnDrop<'_>,
    stderr_reader: thread::JoinHandle<String>,
) -> String {
    let _ = qemu.0.kill();
    let _ = qemu.0.wait();
    stderr_reader.join().unwrap_or_default()
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

fn tail(console: &[String]) -> String {
    console[console.len().saturating_sub(40)..].join("\n")
}

/// Kills QEMU whatever way the run ends, so no VM outlives its run.
struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// A private directory for the run's sockets and initramfs, removed at the end.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> Result<Self, RunError> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "pcieipc-testbed-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).map_err(|source| RunError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_log_dump_is_left_out_of_the_echo_only_when_asked() {
        let console = [
            "PASS: first".to_owned(),
            MARK_DMESG_BEGIN.to_owned(),
            "[    1.0] pcieipc: loaded".to_owned(),
            MARK_DMESG_END.to_owned(),
            "guest: 1 passed, 0 failed".to_owned(),
        ];
        let echoed = |echo: Echo| {
            let mut in_kernel_log = false;
            console
                .iter()
                .filter(|line| echo.shows(line, &mut in_kernel_log))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(echoed(Echo::All), console);
        assert!(echoed(Echo::Nothing).is_empty());
        assert_eq!(
            echoed(Echo::AllButKernelLog),
            [console[0].clone(), console[4].clone()]
        );
        assert_eq!(kernel_log(&console), Some(&console[2..3]));
    }

    #[test]
    fn kernel_log_is_judged_inside_the_dump() {
        let console: Vec<String> = [
            "WARNING: printed by the guest script, not the kernel",
            MARK_DMESG_BEGIN,
            "[    0.1] pcieipc 0.1.0 loaded",
            "[    0.2] WARNING: CPU: 0 PID: 1 at kmod/chardev.rs:10",
            "[    0.3] Call Trace:",
            MARK_DMESG_END,
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            kernel_log_failures(&console),
            [
                "[    0.2] WARNING: CPU: 0 PID: 1 at kmod/chardev.rs:10",
                "[    0.3] Call Trace:"
            ]
        );
        assert!(kernel_log_failures(&console[2..3]).is_empty());
    }

    #[test]
    fn only_a_death_or_silence_before_init_boots_again() {
        let exited = |guest_started, tail: &str| RunError::QemuExited {
            status: "exit status: 0".into(),
            stderr: String::new(),
            tail: tail.into(),
            guest_started,
        };
        let panic = "Kernel panic - not syncing: Fatal exception in interrupt";
        assert!(failed_before_init(&exited(false, panic)));
        // Once /init ran, a death may be the module's or the script's.
        assert!(!failed_before_init(&exited(true, panic)));
        // QEMU dropping its monitor over bad arguments is no boot at all.
        assert!(!failed_before_init(&exited(false, "(connection closed)")));
        let timeout = |guest_started| RunError::Timeout {
            limit: Duration::from_secs(20),
            diagnosis: String::new(),
            tail: String::new(),
            stderr: String::new(),
            guest_started,
        };
        // A kernel silent from boot is booted again; a guest stuck in its
        // script (the module's or the script's doing) is not.
        assert!(failed_before_init(&timeout(false)));
        assert!(!failed_before_init(&timeout(true)));
    }
}
