//! The fallback where tracing is unavailable: polls every PCI device's
//! `aer_dev_*` counters under `<root>/sys/bus/pci/devices` and turns what
//! rose since the last poll into events (`counters::delta_event`). The first
//! reading is the baseline: errors counted before the poller started are not
//! events, unless a baseline kept from an earlier poller (`pcieipc monitor
//! --store`) says where that one stopped. Devices that appear later start
//! from their first reading.

use std::{
    collections::BTreeMap,
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
};

use super::{counters, SourceError};
use crate::events::Event;
use crate::probe::attributes::{parse_aer_counters, AerCounterFile};

pub struct CounterPoller {
    devices_dir: PathBuf,
    last: CounterReadings,
    next_seq: u64,
}

/// (device, index into `counters::FILES`) -> its last reading.
pub type CounterReadings = BTreeMap<(String, usize), AerCounterFile>;

/// What one poll gave: the events, and the files that could not be read or
/// parsed (reported by the caller; the others are still polled).
#[derive(Debug, Default)]
pub struct CounterBatch {
    pub events: Vec<Event>,
    pub problems: Vec<SourceError>,
}

impl CounterPoller {
    /// Takes the baseline; fails when no device has counters.
    pub fn open(sysfs_root: &Path) -> Result<CounterPoller, SourceError> {
        CounterPoller::open_from(sysfs_root, &CounterReadings::new())
    }

    /// As `open`, but files that `kept` has a reading of start from that
    /// reading: what rose since an earlier poller's last poll becomes the
    /// first poll's events, so a restarted monitor misses nothing. (A file
    /// whose count went down since, a device removed and found again, starts
    /// anew as `counters::delta_event` says.)
    pub fn open_from(
        sysfs_root: &Path,
        kept: &CounterReadings,
    ) -> Result<CounterPoller, SourceError> {
        let mut poller = CounterPoller {
            devices_dir: sysfs_root.join("sys/bus/pci/devices"),
            last: BTreeMap::new(),
            next_seq: 0,
        };
        let first = poller.poll(0)?;
        if let Some(problem) = first.problems.into_iter().next() {
            return Err(problem);
        }
        if poller.last.is_empty() {
            return Err(SourceError::NoCounters {
                path: poller.devices_dir,
            });
        }
        for (key, reading) in poller.last.iter_mut() {
            if let Some(earlier) = kept.get(key) {
                reading.clone_from(earlier);
            }
        }
        Ok(poller)
    }

    /// The last reading of every file: what the next poll compares with.
    pub fn readings(&self) -> &CounterReadings {
        &self.last
    }

    /// The devices whose counters are followed.
    pub fn devices(&self) -> usize {
        let mut names: Vec<&String> = self.last.keys().map(|(d, _)| d).collect();
        names.dedup();
        names.len()
    }

    /// Reads every counter file; events for what rose, dated `now_ns`.
    pub fn poll(&mut self, now_ns: u64) -> Result<CounterBatch, SourceError> {
        let entries = fs::read_dir(&self.devices_dir)
            .map_err(|source| SourceError::io(&self.devices_dir, source))?;
        let mut devices: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        devices.sort();
        let mut batch = CounterBatch::default();
        let mut seen = BTreeMap::new();
        for device in devices {
            for (index, (file, severity)) in counters::FILES.iter().enumerate() {
                let path = self.devices_dir.join(&device).join(file);
                let text = match fs::read_to_string(&path) {
                    Ok(text) => text,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(source) => {
                        batch.problems.push(SourceError::io(path, source));
                        continue;
                    }
                };
                let reading = match parse_aer_counters(&text) {
                    Ok(reading) => reading,
                    Err(source) => {
                        batch.problems.push(SourceError::Counters { path, source });
                        continue;
                    }
                };
                let key = (device.clone(), index);
                if let Some(before) = self.last.get(&key) {
                    if let Some(mut event) =
                        counters::delta_event(&device, *severity, before, &reading, now_ns)
                    {
                        event.seq = self.next_seq;
                        self.next_seq += 1;
                        batch.events.push(event);
                    }
                }
                seen.insert(key, reading);
            }
        }
        // Devices that went away are forgotten; ones that come back start anew.
        self.last = seen;
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventSource, Severity};

    fn fake_sysfs(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("pcieipc-counters-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("sys/bus/pci/devices/0000:00:10.0")).unwrap();
        fs::create_dir_all(root.join("sys/bus/pci/devices/0000:01:00.0")).unwrap();
        root
    }

    fn write(root: &Path, device: &str, file: &str, text: &str) {
        fs::write(
            root.join("sys/bus/pci/devices").join(device).join(file),
            text,
        )
        .unwrap();
    }

    #[test]
    fn rises_after_the_baseline_become_events() {
        let root = fake_sysfs("rise");
        write(
            &root,
            "0000:00:10.0",
            "aer_dev_correctable",
            "RxErr 0\nBadTLP 4\nTOTAL_ERR_COR 4\n",
        );
        write(
            &root,
            "0000:00:10.0",
            "aer_dev_fatal",
            "DLP 0\nTOTAL_ERR_FATAL 0\n",
        );
        let mut poller = CounterPoller::open(&root).unwrap();
        assert_eq!(poller.devices(), 1);
        let quiet = poller.poll(10).unwrap();
        assert!(quiet.events.is_empty() && quiet.problems.is_empty());

        write(
            &root,
            "0000:00:10.0",
            "aer_dev_correctable",
            "RxErr 1\nBadTLP 5\nTOTAL_ERR_COR 6\n",
        );
        write(
            &root,
            "0000:00:10.0",
            "aer_dev_fatal",
            "DLP 1\nTOTAL_ERR_FATAL 1\n",
        );
        let batch = poller.poll(20).unwrap();
        type Summary = (String, u64, Vec<(u8, Severity)>, Option<u64>);
        let got: Vec<Summary> = batch
            .events
            .iter()
            .map(|e| {
                (
                    e.bdf.clone(),
                    e.seq,
                    e.errors.iter().map(|x| (x.bit, x.severity)).collect(),
                    e.occurrences,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "0000:00:10.0".to_string(),
                    0,
                    vec![(0, Severity::Correctable), (6, Severity::Correctable)],
                    Some(2)
                ),
                (
                    "0000:00:10.0".to_string(),
                    1,
                    vec![(4, Severity::Fatal)],
                    Some(1)
                ),
            ]
        );
        assert!(batch
            .events
            .iter()
            .all(|e| e.source == EventSource::Counters && e.timestamp_ns == 20));

        // A file that stops parsing is reported, the poller goes on.
        write(&root, "0000:00:10.0", "aer_dev_fatal", "garbage\n");
        let batch = poller.poll(30).unwrap();
        assert!(batch.events.is_empty());
        assert_eq!(batch.problems.len(), 1);
        assert!(batch.problems[0].to_string().contains("aer_dev_fatal"));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_kept_baseline_turns_rises_while_stopped_into_the_first_events() {
        let root = fake_sysfs("kept");
        let device = "0000:00:10.0";
        write(
            &root,
            device,
            "aer_dev_correctable",
            "BadTLP 4\nTOTAL_ERR_COR 4\n",
        );
        let kept = CounterPoller::open(&root).unwrap().readings().clone();
        // Two more while no poller ran.
        write(
            &root,
            device,
            "aer_dev_correctable",
            "BadTLP 6\nTOTAL_ERR_COR 6\n",
        );
        let mut restarted = CounterPoller::open_from(&root, &kept).unwrap();
        let batch = restarted.poll(5).unwrap();
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.events[0].occurrences, Some(2));
        assert_eq!(batch.events[0].errors[0].short, "BadTLP");
        assert_eq!(restarted.readings()[&(device.to_string(), 0)].total, 6);
        // A fresh poller takes what is there as its baseline.
        let mut fresh = CounterPoller::open(&root).unwrap();
        assert!(fresh.poll(6).unwrap().events.is_empty());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn no_counters_anywhere_is_an_error() {
        let root = fake_sysfs("none");
        let err = CounterPoller::open(&root).err().unwrap();
        assert!(matches!(err, SourceError::NoCounters { .. }), "{err}");
        let err = CounterPoller::open(&root.join("nowhere")).err().unwrap();
        assert!(matches!(err, SourceError::Io { .. }), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }
}
