//! The fallback where tracing is unavailable: polls every PCI device's
//! `aer_dev_*` counters under `<root>/sys/bus/pci/devices` and turns what
//! rose since the last poll into events (`counters::delta_event`). The first
//! reading is the baseline: errors counted before the poller started are not
//! events, unless a baseline kept from an earlier poller (`pcieipc monitor
//! --store`) says where that one stopped. Devices that appear later start
//! from their first reading.

use std::{
    collections::{btree_map::Entry, BTreeMap, BTreeSet},
    fs,
    io::ErrorKind,
    os::{fd::OwnedFd, unix::fs::FileExt},
    path::{Path, PathBuf},
};

use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use nix::sys::statfs::{fstatfs, SYSFS_MAGIC};

use super::{counters, SourceError};
use crate::events::Event;
use crate::probe::attributes::{parse_aer_counters, AerCounterFile};

pub struct CounterPoller {
    devices_dir: PathBuf,
    /// Each device's directory, opened once: opening the counter files by
    /// their full paths walked each device's link and deep directory again
    /// at every poll, most of a poll's time.
    device_dirs: BTreeMap<String, OwnedFd>,
    /// Each counter file, opened once (same keys as `last`).
    files: BTreeMap<(String, usize), CounterFile>,
    /// One read buffer for every file (a counter file is under a page).
    buffer: Vec<u8>,
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
            device_dirs: BTreeMap::new(),
            files: BTreeMap::new(),
            buffer: vec![0; 8192],
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
                // The file's bytes no longer give its last reading: the next
                // poll parses them and compares with the kept one.
                if let Some(file) = poller.files.get_mut(key) {
                    file.bytes.clear();
                }
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
        for device in &devices {
            let dir = match self.device_dirs.entry(device.clone()) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => {
                    let path = self.devices_dir.join(device);
                    match open(
                        &path,
                        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    ) {
                        Ok(fd) => entry.insert(fd),
                        Err(errno) => {
                            batch.problems.push(SourceError::io(path, errno.into()));
                            continue;
                        }
                    }
                }
            };
            let mut stale = false;
            for (index, (file, severity)) in counters::FILES.iter().enumerate() {
                let key = (device.clone(), index);
                let path = || self.devices_dir.join(device).join(file);
                if self.files.get(&key).is_some_and(CounterFile::replaced) {
                    self.files.remove(&key);
                }
                let kept = match self.files.entry(key.clone()) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => match CounterFile::open(dir, file) {
                        Ok(opened) => entry.insert(opened),
                        Err(e) if e.kind() == ErrorKind::NotFound => {
                            // Gone from a directory that had it: the device was
                            // removed and maybe added again; open it anew.
                            stale |= self.last.contains_key(&key);
                            continue;
                        }
                        Err(source) => {
                            batch.problems.push(SourceError::io(path(), source));
                            continue;
                        }
                    },
                };
                let changed = match kept.reread(&mut self.buffer) {
                    Ok(changed) => changed,
                    Err(source) => {
                        self.files.remove(&key);
                        // ENODEV: a removed device's attribute (sysfs).
                        if source.raw_os_error() == Some(nix::libc::ENODEV) {
                            stale = true;
                        } else {
                            batch.problems.push(SourceError::io(path(), source));
                        }
                        continue;
                    }
                };
                if !changed {
                    if let Some(reading) = self.last.remove(&key) {
                        seen.insert(key, reading);
                        continue;
                    }
                }
                let reading = match parse_aer_counters(&String::from_utf8_lossy(&kept.bytes)) {
                    Ok(reading) => reading,
                    Err(source) => {
                        batch.problems.push(SourceError::Counters {
                            path: path(),
                            source,
                        });
                        continue;
                    }
                };
                if let Some(before) = self.last.get(&key) {
                    if let Some(mut event) =
                        counters::delta_event(device, *severity, before, &reading, now_ns)
                    {
                        event.seq = self.next_seq;
                        self.next_seq += 1;
                        batch.events.push(event);
                    }
                }
                seen.insert(key, reading);
            }
            if stale {
                self.device_dirs.remove(device);
            }
        }
        let listed: BTreeSet<&String> = devices.iter().collect();
        self.device_dirs.retain(|device, _| listed.contains(device));
        self.files.retain(|(device, _), _| listed.contains(device));
        // Devices that went away are forgotten; ones that come back start anew.
        self.last = seen;
        Ok(batch)
    }
}

/// One counter file, kept open: on sysfs a read at offset 0 asks the kernel
/// for the counts anew, so a poll is one pread per file where opening it
/// again walked its path (most of a poll's time), and a file whose bytes did
/// not change is not parsed again.
struct CounterFile {
    file: fs::File,
    /// On sysfs. Elsewhere (a copied tree: tests, the CPU bench's fixture)
    /// a file may be replaced by a rename, which `replaced` notices.
    on_sysfs: bool,
    /// What the last read gave.
    bytes: Vec<u8>,
}

impl CounterFile {
    fn open(dir: &OwnedFd, name: &str) -> std::io::Result<CounterFile> {
        let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
        let on_sysfs = fstatfs(&fd).is_ok_and(|fs| fs.filesystem_type() == SYSFS_MAGIC);
        Ok(CounterFile {
            file: fs::File::from(fd),
            on_sysfs,
            bytes: Vec::new(),
        })
    }

    /// Whether the open file is no longer the one its name names.
    fn replaced(&self) -> bool {
        !self.on_sysfs && fstat(&self.file).is_ok_and(|stat| stat.st_nlink == 0)
    }

    /// Reads the whole file anew (through `buffer`); whether its bytes
    /// differ from the last read's. Sysfs attributes and regular files give
    /// all they have in one read when the buffer is larger, so a short read
    /// ends the file.
    fn reread(&mut self, buffer: &mut Vec<u8>) -> std::io::Result<bool> {
        let mut filled = 0;
        loop {
            let count = self.file.read_at(&mut buffer[filled..], filled as u64)?;
            filled += count;
            if count == 0 || filled < buffer.len() {
                break;
            }
            let grown = buffer.len() * 2;
            buffer.resize(grown, 0);
        }
        let changed = buffer[..filled] != self.bytes[..];
        if changed {
            self.bytes.clear();
            self.bytes.extend_from_slice(&buffer[..filled]);
        }
        Ok(changed)
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

    /// An aer_dev_correctable file that counts `count` Bad TLPs.
    fn bad_tlps(count: u64) -> String {
        format!("BadTLP {count}\nTOTAL_ERR_COR {count}\n")
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
        write(&root, device, "aer_dev_correctable", &bad_tlps(4));
        let kept = CounterPoller::open(&root).unwrap().readings().clone();
        // Two more while no poller ran.
        write(&root, device, "aer_dev_correctable", &bad_tlps(6));
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
    fn a_file_replaced_by_a_rename_is_read_anew() {
        let root = fake_sysfs("renamed");
        let device = "0000:00:10.0";
        write(&root, device, "aer_dev_correctable", &bad_tlps(4));
        let mut poller = CounterPoller::open(&root).unwrap();
        let file = root
            .join("sys/bus/pci/devices")
            .join(device)
            .join("aer_dev_correctable");
        fs::write(file.with_extension("new"), bad_tlps(7)).unwrap();
        fs::rename(file.with_extension("new"), &file).unwrap();
        let batch = poller.poll(1).unwrap();
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.events[0].occurrences, Some(3));
        // Unchanged since: no event, the reading kept.
        assert!(poller.poll(2).unwrap().events.is_empty());
        assert_eq!(poller.readings()[&(device.to_string(), 0)].total, 7);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_device_removed_and_added_again_starts_anew() {
        let root = fake_sysfs("readded");
        let device = "0000:00:10.0";
        write(&root, device, "aer_dev_correctable", &bad_tlps(4));
        let mut poller = CounterPoller::open(&root).unwrap();
        let dir = root.join("sys/bus/pci/devices").join(device);
        fs::remove_dir_all(&dir).unwrap();
        fs::create_dir_all(&dir).unwrap();
        write(&root, device, "aer_dev_correctable", &bad_tlps(1));
        // The directory the poller held is gone: nothing read, no event.
        let gone = poller.poll(1).unwrap();
        assert!(gone.events.is_empty() && gone.problems.is_empty());
        // The new one is opened and read as a first reading...
        assert!(poller.poll(2).unwrap().events.is_empty());
        assert_eq!(poller.readings()[&(device.to_string(), 0)].total, 1);
        // ... from which rises are events again.
        write(&root, device, "aer_dev_correctable", &bad_tlps(3));
        let batch = poller.poll(3).unwrap();
        assert_eq!(batch.events.len(), 1);
        assert_eq!(batch.events[0].occurrences, Some(2));
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
