//! Joining a communicator: checking what the caller asked for, binding the
//! rank to its CPU, opening the transport with windows sized from the
//! options, and agreeing with every peer on reading each other's memory.

use std::time::Instant;

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use super::agreement::Agreement;
use super::checked::CheckedCopies;
use super::message::{MESSAGE_HEADER_BYTES, ONE_SHOT_SPILLED_DATA};
use super::options::CommOptions;
use super::peers::{Peers, WaitPolicy};
use super::shadows::Shadows;
use super::streams::SlotStreams;
use super::Communicator;
use crate::engine::cache_bypass::StreamingStores;
use crate::engine::collectives::RingSettings;
use crate::engine::error::EngineError;
use crate::engine::fault_monitor::FaultMonitor;
use crate::engine::followed_device::FollowedDevice;
use crate::engine::link_monitor::{tracefs_root, LinkMonitor};
use crate::engine::slot_fill::FillChooser;
use crate::engine::transport::{Setup, WindowSizes};
use crate::trace::{Recorder, TRACE_ENV};

fn bind_to_cpu(cpu: usize) -> Result<(), EngineError> {
    let mut set = CpuSet::new();
    set.set(cpu)
        .and_then(|()| sched_setaffinity(Pid::from_raw(0), &set))
        .map_err(|errno| EngineError::BindCpu {
            cpu,
            source: errno.into(),
        })
}

impl Communicator {
    /// Joins the communicator `rendezvous` (a job-unique name) as `rank` of
    /// `nranks`. Returns once every rank has joined and the transport is up.
    pub fn init(
        rendezvous: &str,
        rank: usize,
        nranks: usize,
        options: CommOptions,
    ) -> Result<Communicator, EngineError> {
        let started = Instant::now();
        let started_ns = crate::trace::monotonic_ns();
        if nranks == 0 {
            return Err(EngineError::NoRanks);
        }
        if rank >= nranks {
            return Err(EngineError::RankOutOfRange { rank, nranks });
        }
        if let Some(cpu) = options.bind_cpu {
            bind_to_cpu(cpu)?;
        }
        let in_flight = options.in_flight.max(1);
        // Steps after the first that one chunk makes: 2(N−1) − 1 for all_reduce.
        let relay_steps = (2 * nranks).saturating_sub(3).max(1);
        let setup = Setup {
            rendezvous,
            rank,
            nranks,
            sizes: WindowSizes {
                slot_bytes: MESSAGE_HEADER_BYTES + options.chunk_policy.max_chunk_bytes(),
                raw_slots: in_flight + 1,
                relay_slots: (in_flight + 1) * relay_steps,
                // A message at the budget fits one window, after the
                // stamp's cache-line pair (message.rs).
                one_shot_bytes: ONE_SHOT_SPILLED_DATA + options.one_shot_read_budget,
                backend_bytes: options.backend_bytes,
            },
            join_timeout: options.join_timeout,
            secret: options.secret,
        };
        let trace_file = options
            .trace
            .clone()
            .or_else(|| std::env::var_os(TRACE_ENV).map(std::path::PathBuf::from))
            .map(|prefix| crate::trace::rank_file(&prefix, rank));
        let mut transport = options.transport.open(&setup)?;
        if trace_file.is_some() {
            transport.log_wakes();
        }
        // The link this rank's data crosses: the transport's own device's,
        // or a device the transport does not follow, followed through the
        // kernel's tracepoints where the job asks for them.
        let link_monitor: Option<Box<dyn LinkMonitor>> = if transport.capabilities().link_events {
            transport.take_link_monitor()
        } else {
            match (&options.link_device, tracefs_root()) {
                (Some(device), Some(root)) => Some(Box::new(
                    FollowedDevice::open(device, options.link, &root)
                        .map_err(|source| EngineError::FollowDevice { rank, source })?,
                )),
                _ => None,
            }
        };
        let monitor = FaultMonitor::new(rank, link_monitor, options.retrain_degraded);
        let link = monitor.link_facts().or(options.link);
        // Rank 0's choice: the windows were sized with it.
        let sizes = transport.sizes();
        let in_flight = sizes.raw_slots - 1;
        let checksums = options
            .chunk_checksums
            .unwrap_or(transport.capabilities().device_memory);
        if options.damage.is_some() && !checksums {
            return Err(EngineError::DamageWithoutChecksums { rank });
        }
        let device_memory = transport.capabilities().device_memory;
        let streaming_from = options
            .streaming_stores
            .working_set_threshold(device_memory, std::path::Path::new("/"));
        let fill_chooser = (options.streaming_stores == StreamingStores::Auto
            && streaming_from != usize::MAX)
            .then(FillChooser::new);
        let agreement = Agreement::new(rank, nranks, options.chunk_policy, fill_chooser);
        let policy = WaitPolicy::new(
            options.spin,
            options.bind_cpu.is_some(),
            options.peer_timeout,
            options.join_timeout,
        );
        let mut peers = Peers::new(
            transport,
            agreement,
            monitor,
            checksums.then(|| Shadows::new(sizes.raw_slots, sizes.relay_slots, options.damage)),
            policy,
            trace_file.map(|file| Recorder::new(rank, file)),
        );
        peers.transport.publish_link(link);
        let single_copy = peers.agree_on_peer_reads(
            options.single_copy,
            &options.single_copy_messages,
            &options.direct_messages,
        )?;
        peers.joining = false;
        if let Some(trace) = &peers.trace {
            trace.span("init", "init", started_ns, []);
        }
        Ok(Communicator {
            peers,
            streams: SlotStreams::new(
                sizes.raw_slots,
                sizes.relay_slots,
                checksums.then(|| CheckedCopies::new(nranks)),
            ),
            ring: RingSettings {
                single_copy_messages: single_copy.then(|| options.single_copy_messages.clone()),
                streaming_from,
            },
            options: CommOptions {
                in_flight,
                link,
                ..options
            },
            direct_scratch: Vec::new(),
            init_time: started.elapsed(),
        })
    }
}
