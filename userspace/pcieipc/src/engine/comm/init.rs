//! Joining a communicator: checking what the caller asked for, binding the
//! rank to its CPU, opening the transport with windows sized from the
//! options, and agreeing with every peer on reading each other's memory.

use std::time::{Duration, Instant};

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use super::checksums::Checksums;
use super::options::CommOptions;
use super::slots::MESSAGE_HEADER_BYTES;
use super::{Communicator, StreamCounts};
use crate::engine::cache_bypass::StreamingStores;
use crate::engine::error::EngineError;
use crate::engine::fault_monitor::FaultMonitor;
use crate::engine::followed_device::FollowedDevice;
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
                // A message at the budget fits one window, stamp included.
                one_shot_bytes: MESSAGE_HEADER_BYTES + options.one_shot_read_budget,
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
        let link = transport.device_link().or(options.link);
        // A device the transport does not follow, followed through the
        // kernel's tracepoints where the job asks for them.
        let followed = match (
            &options.link_device,
            transport.capabilities().link_events,
            crate::engine::transport::link_tracefs_root(),
        ) {
            (Some(device), false, Some(root)) => Some(
                FollowedDevice::open(device, link, &root)
                    .map_err(|source| EngineError::FollowDevice { rank, source })?,
            ),
            _ => None,
        };
        // Rank 0's choice: the windows were sized with it.
        let sizes = transport.sizes();
        let in_flight = sizes.raw_slots - 1;
        let checksums = options
            .chunk_checksums
            .unwrap_or(transport.capabilities().device_memory)
            .then(|| Checksums::new(nranks, sizes.raw_slots, sizes.relay_slots, options.damage));
        if options.damage.is_some() && checksums.is_none() {
            return Err(EngineError::DamageWithoutChecksums { rank });
        }
        let device_memory = transport.capabilities().device_memory;
        let streaming_from = options
            .streaming_stores
            .working_set_threshold(device_memory, std::path::Path::new("/"));
        let fill_chooser = (options.streaming_stores == StreamingStores::Auto
            && streaming_from != usize::MAX)
            .then(FillChooser::new);
        let mut communicator = Communicator {
            transport,
            rank,
            nranks,
            options: CommOptions {
                in_flight,
                ..options
            },
            monitor: FaultMonitor::new(rank, followed, options.retrain_degraded),
            calls: 0,
            raw: StreamCounts::new(sizes.raw_slots),
            relay: StreamCounts::new(sizes.relay_slots),
            one_shot_rounds: 0,
            direct_scratch: Vec::new(),
            predecessor_checked: false,
            current_call: None,
            last_call: None,
            trace: trace_file.map(|file| Recorder::new(rank, file)),
            init_time: Duration::ZERO,
            single_copy: false,
            streaming_from,
            fill_chooser,
            current_fill: None,
            measured_call: None,
            joining: true,
            checksums,
        };
        communicator.set_link(link);
        communicator.single_copy = communicator.agree_on_peer_reads()?;
        communicator.joining = false;
        communicator.init_time = started.elapsed();
        if let Some(trace) = &communicator.trace {
            trace.span("init", "init", started_ns, Vec::new());
        }
        Ok(communicator)
    }
}
