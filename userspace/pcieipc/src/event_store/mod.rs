//! The durable event log of `pcieipc monitor --store FILE`: every event the
//! monitor prints, appended to an SQLite file (WAL, so `pcieipc events` reads
//! while the monitor writes), with the counters source's baseline kept in
//! the same transaction, and retention by age and size. `record` is the pure
//! part (rows, keys, times); this file is the I/O.

pub mod record;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use serde::Serialize;

use crate::event_source::counters::FILES;
use crate::event_source::sysfs_counters::CounterReadings;
use crate::probe::attributes::{parse_class, AerCounterFile};
use crate::probe::names::class_name;
pub use record::{DeviceIdentity, StoreContext, StoredEvent};

/// Where the service keeps its store (systemd's StateDirectory=pcieipc).
pub const DEFAULT_STORE: &str = "/var/lib/pcieipc/events.db";
/// `PRAGMA application_id` of an event store: "pcie".
const APPLICATION_ID: i32 = 0x7063_6965;
/// `PRAGMA user_version`: the schema below.
const SCHEMA_VERSION: i32 = 1;
const SCHEMA: &str = "
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    dedup_key TEXT NOT NULL UNIQUE,
    time_unix_ns INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    monotonic_ns INTEGER NOT NULL,
    source TEXT NOT NULL,
    kind TEXT NOT NULL,
    bdf TEXT NOT NULL,
    class TEXT,
    driver TEXT,
    severity TEXT,
    error_names TEXT,
    recovery_step TEXT,
    result TEXT,
    link_before TEXT,
    link_after TEXT,
    occurrences INTEGER,
    line TEXT NOT NULL,
    json TEXT NOT NULL
);
CREATE INDEX events_by_time ON events (time_unix_ns);
CREATE INDEX events_by_device ON events (bdf, time_unix_ns);
CREATE TABLE counter_baseline (
    boot_id TEXT NOT NULL,
    bdf TEXT NOT NULL,
    file TEXT NOT NULL,
    total INTEGER NOT NULL,
    nonzero_counts TEXT NOT NULL,
    PRIMARY KEY (boot_id, bdf, file)
);
";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: not an SQLite database; give --store a new file or an event store")]
    NotSqlite { path: PathBuf },
    #[error("{path}: an SQLite database, but not a pcieipc event store (application_id {found:#x}); give --store a new file or an event store")]
    NotAnEventStore { path: PathBuf, found: i32 },
    #[error("{path}: event store schema {found}, newer than this program's {SCHEMA_VERSION}")]
    NewerSchema { path: PathBuf, found: i32 },
    #[error("{path}: the disk is full; the events stored before are kept, the ones not stored are lost unless a source keeps them (the module's backlog, the counters)")]
    DiskFull { path: PathBuf },
    // The SQLite error is part of the message (not a `source`): it says
    // why, and nothing else would.
    #[error("{path}: cannot write there ({error}); the events stored before are kept")]
    ReadOnly {
        path: PathBuf,
        error: rusqlite::Error,
    },
    #[error("{path}: no event store there (pcieipc monitor --store creates it)")]
    Missing { path: PathBuf },
    #[error("{path}: {error}")]
    Sqlite {
        path: PathBuf,
        error: rusqlite::Error,
    },
    #[error("{path}: a stored counter baseline does not parse: {source}")]
    Baseline {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// An open event store.
pub struct EventStore {
    connection: Connection,
    path: PathBuf,
}

/// Which events to read.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub since_unix_ns: Option<i64>,
    pub bdf: Option<String>,
}

/// One stored event, read back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredRow {
    pub id: i64,
    pub time_unix_ns: i64,
    pub boot_id: String,
    pub source: String,
    pub kind: String,
    pub bdf: String,
    pub class: Option<String>,
    pub driver: Option<String>,
    pub severity: Option<String>,
    pub line: String,
    /// The event as `pcieipc monitor --json` printed it.
    pub json: String,
}

/// `pcieipc events --summary`: AER errors per device, error and severity,
/// and the other events per device and kind, as `ras-mc-ctl --summary`
/// counts them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub errors: Vec<ErrorCount>,
    pub others: Vec<KindCount>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorCount {
    pub bdf: String,
    pub class: Option<String>,
    pub driver: Option<String>,
    pub severity: String,
    pub error: String,
    /// Reports of it: one per tracefs or counters event, one per error the
    /// module saw (its first recovery step; the later steps are the same error).
    pub reports: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindCount {
    pub bdf: String,
    pub kind: String,
    pub events: u64,
}

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub expired: u64,
    pub over_size: u64,
}

impl EventStore {
    /// Opens the store at `path` for writing, creating it (and its schema)
    /// when the file does not exist or is empty.
    pub fn open(path: &Path) -> Result<EventStore, StoreError> {
        let connection = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| store_error(path, source))?;
        let store = EventStore {
            connection,
            path: path.to_path_buf(),
        };
        store.prepare_for_writing()?;
        Ok(store)
    }

    /// Opens an existing store for reading.
    pub fn open_read_only(path: &Path) -> Result<EventStore, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let connection = Connection::open_with_flags(path, flags)
            .and_then(|connection| {
                // Opening does not read; the first query does.
                connection.pragma_query_value(None, "user_version", |row| row.get::<_, i32>(0))?;
                Ok(connection)
            })
            .or_else(|error| {
                // A WAL store on a read-only file system (a disk remounted
                // read-only, a copy on read-only media) cannot get the -shm
                // file readers share: read it as a file nobody writes.
                if error.sqlite_error_code() != Some(ErrorCode::CannotOpen) {
                    return Err(error);
                }
                let uri = format!(
                    "file:{}?immutable=1",
                    path.to_string_lossy()
                        .replace('%', "%25")
                        .replace('?', "%3f")
                        .replace('#', "%23")
                );
                Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
            })
            .map_err(|source| store_error(path, source))?;
        let store = EventStore {
            connection,
            path: path.to_path_buf(),
        };
        store.check_schema()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, source: rusqlite::Error) -> StoreError {
        store_error(&self.path, source)
    }

    /// The schema version of an existing store; 0 for an empty file.
    fn check_schema(&self) -> Result<i32, StoreError> {
        let pragma = |name: &str| -> Result<i32, StoreError> {
            self.connection
                .pragma_query_value(None, name, |row| row.get(0))
                .map_err(|source| self.error(source))
        };
        let application_id = pragma("application_id")?;
        let version = pragma("user_version")?;
        let tables: i64 = self
            .connection
            .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
            .map_err(|source| self.error(source))?;
        if tables > 0 && application_id != APPLICATION_ID {
            return Err(StoreError::NotAnEventStore {
                path: self.path.clone(),
                found: application_id,
            });
        }
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: self.path.clone(),
                found: version,
            });
        }
        Ok(if tables == 0 { 0 } else { version })
    }

    /// WAL, the schema on a new file, and a first write: a store that
    /// cannot be written (read-only, full) fails here, before any event.
    fn prepare_for_writing(&self) -> Result<(), StoreError> {
        let version = self.check_schema()?;
        let run = |sql: &str| {
            self.connection
                .execute_batch(sql)
                .map_err(|source| self.error(source))
        };
        if version == 0 {
            // auto_vacuum must be chosen before the first table exists; it
            // lets retention give deleted pages back to the file system.
            run("PRAGMA auto_vacuum = INCREMENTAL;")?;
        }
        let mode: String = self
            .connection
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(|source| self.error(source))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::ReadOnly {
                path: self.path.clone(),
                error: rusqlite::Error::InvalidParameterName(format!("journal_mode stayed {mode}")),
            });
        }
        // A crash loses at most the last transaction, never corrupts: WAL
        // with synchronous NORMAL.
        run("PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;")?;
        if version == 0 {
            run(&format!(
                "BEGIN IMMEDIATE; {SCHEMA} PRAGMA application_id = {APPLICATION_ID}; \
                 PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))?;
        } else {
            run("BEGIN IMMEDIATE; COMMIT;")?;
        }
        Ok(())
    }

    /// Appends `events` (those already stored are left out) and, when
    /// given, replaces this boot's counter baseline with `baseline`, in one
    /// transaction. Returns how many events were new.
    pub fn append(
        &mut self,
        events: &[StoredEvent],
        baseline: Option<(&str, &CounterReadings)>,
    ) -> Result<usize, StoreError> {
        let path = self.path.clone();
        let fail = |source| store_error(&path, source);
        let transaction = self.connection.transaction().map_err(fail)?;
        let mut added = 0;
        {
            let mut insert = transaction
                .prepare_cached(
                    "INSERT OR IGNORE INTO events (dedup_key, time_unix_ns, boot_id, monotonic_ns,
                     source, kind, bdf, class, driver, severity, error_names, recovery_step,
                     result, link_before, link_after, occurrences, line, json)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                     ?16, ?17, ?18)",
                )
                .map_err(fail)?;
            for event in events {
                added += insert
                    .execute(params![
                        event.dedup_key,
                        event.time_unix_ns,
                        event.boot_id,
                        event.monotonic_ns as i64,
                        event.source,
                        event.kind,
                        event.bdf,
                        event.identity.class,
                        event.identity.driver,
                        event.severity,
                        event.error_names,
                        event.recovery_step,
                        event.result,
                        event.link_before,
                        event.link_after,
                        event.occurrences.map(|count| count as i64),
                        event.line,
                        event.json,
                    ])
                    .map_err(fail)?;
            }
        }
        if let Some((boot_id, readings)) = baseline {
            // Another boot's counters started again from zero: its baseline
            // means nothing now.
            transaction
                .execute("DELETE FROM counter_baseline", [])
                .map_err(fail)?;
            let mut insert = transaction
                .prepare_cached(
                    "INSERT INTO counter_baseline (boot_id, bdf, file, total, nonzero_counts)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(fail)?;
            for ((bdf, file), reading) in readings {
                let counts = serde_json::to_string(&reading.nonzero_counts)
                    .expect("names and counts serialise");
                insert
                    .execute(params![
                        boot_id,
                        bdf,
                        FILES[*file].0,
                        reading.total as i64,
                        counts
                    ])
                    .map_err(fail)?;
            }
        }
        transaction.commit().map_err(fail)?;
        Ok(added)
    }

    /// The counter baseline stored for `boot_id` (empty for another boot).
    pub fn counter_baseline(&self, boot_id: &str) -> Result<CounterReadings, StoreError> {
        let mut query = self
            .connection
            .prepare(
                "SELECT bdf, file, total, nonzero_counts FROM counter_baseline WHERE boot_id = ?1",
            )
            .map_err(|source| self.error(source))?;
        let rows = query
            .query_map([boot_id], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, String>(3)?,
                ))
            })
            .map_err(|source| self.error(source))?;
        let mut readings = BTreeMap::new();
        for row in rows {
            let (bdf, file, total, counts) = row.map_err(|source| self.error(source))?;
            // A file name this program does not know is left out: its
            // counter then starts from its first reading.
            let Some(index) = FILES.iter().position(|(name, _)| *name == file) else {
                continue;
            };
            let nonzero_counts =
                serde_json::from_str(&counts).map_err(|source| StoreError::Baseline {
                    path: self.path.clone(),
                    source,
                })?;
            readings.insert(
                (bdf, index),
                AerCounterFile {
                    nonzero_counts,
                    total: total as u64,
                },
            );
        }
        Ok(readings)
    }

    /// Removes events older than `max_age`, then the oldest until the
    /// events take at most `max_bytes`, and gives the freed pages back.
    pub fn enforce_retention(
        &mut self,
        now_unix_ns: i64,
        max_age: Duration,
        max_bytes: u64,
    ) -> Result<Retention, StoreError> {
        let path = self.path.clone();
        let fail = |source| store_error(&path, source);
        let cutoff =
            now_unix_ns.saturating_sub(i64::try_from(max_age.as_nanos()).unwrap_or(i64::MAX));
        let expired = self
            .connection
            .execute("DELETE FROM events WHERE time_unix_ns < ?1", [cutoff])
            .map_err(fail)? as u64;
        let mut over_size = 0;
        loop {
            let used: i64 = self
                .connection
                .query_row(
                    "SELECT (page_count - freelist_count) * page_size
                     FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()",
                    [],
                    |row| row.get(0),
                )
                .map_err(fail)?;
            let stored: i64 = self
                .connection
                .query_row("SELECT count(*) FROM events", [], |row| row.get(0))
                .map_err(fail)?;
            if used as u64 <= max_bytes || stored == 0 {
                break;
            }
            // A tenth at a time: the size only shrinks by whole pages.
            over_size += self
                .connection
                .execute(
                    "DELETE FROM events WHERE id IN
                     (SELECT id FROM events ORDER BY time_unix_ns, id LIMIT ?1)",
                    [(stored / 10).max(1)],
                )
                .map_err(fail)? as u64;
        }
        self.connection
            .execute_batch("PRAGMA incremental_vacuum;")
            .map_err(fail)?;
        Ok(Retention { expired, over_size })
    }

    /// The events `filter` selects, oldest first.
    pub fn events(&self, filter: &EventFilter) -> Result<Vec<StoredRow>, StoreError> {
        let mut query = self
            .connection
            .prepare(
                "SELECT id, time_unix_ns, boot_id, source, kind, bdf, class, driver, severity,
                 line, json FROM events
                 WHERE time_unix_ns >= ?1 AND (?2 IS NULL OR bdf = ?2)
                 ORDER BY time_unix_ns, id",
            )
            .map_err(|source| self.error(source))?;
        let rows = query
            .query_map(
                params![filter.since_unix_ns.unwrap_or(i64::MIN), filter.bdf],
                |row| {
                    Ok(StoredRow {
                        id: row.get(0)?,
                        time_unix_ns: row.get(1)?,
                        boot_id: row.get(2)?,
                        source: row.get(3)?,
                        kind: row.get(4)?,
                        bdf: row.get(5)?,
                        class: row.get(6)?,
                        driver: row.get(7)?,
                        severity: row.get(8)?,
                        line: row.get(9)?,
                        json: row.get(10)?,
                    })
                },
            )
            .map_err(|source| self.error(source))?;
        rows.collect::<Result<_, _>>()
            .map_err(|source| self.error(source))
    }

    /// Counts of the events `filter` selects (see `Summary`).
    pub fn summary(&self, filter: &EventFilter) -> Result<Summary, StoreError> {
        let since = filter.since_unix_ns.unwrap_or(i64::MIN);
        let mut errors = self
            .connection
            .prepare(
                "SELECT bdf, class, driver, error.value ->> 'severity', error.value ->> 'short',
                 count(*)
                 FROM events, json_each(events.json, '$.errors') AS error
                 WHERE kind = 'aer' AND time_unix_ns >= ?1 AND (?2 IS NULL OR bdf = ?2)
                 AND (recovery_step IS NULL
                      OR recovery_step IN ('error_detected', 'cor_error_detected'))
                 GROUP BY bdf, class, driver, error.value ->> 'severity', error.value ->> 'short'
                 ORDER BY bdf, 4, 5",
            )
            .map_err(|source| self.error(source))?;
        let errors = errors
            .query_map(params![since, filter.bdf], |row| {
                let severity: String = row.get(3)?;
                Ok(ErrorCount {
                    bdf: row.get(0)?,
                    class: row.get(1)?,
                    driver: row.get(2)?,
                    // The events' JSON says non_fatal; the store and the
                    // metrics say nonfatal.
                    severity: severity.replace('_', ""),
                    error: row.get(4)?,
                    reports: row.get::<_, i64>(5)? as u64,
                })
            })
            .map_err(|source| self.error(source))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| self.error(source))?;
        let mut others = self
            .connection
            .prepare(
                "SELECT bdf, kind, count(*) FROM events
                 WHERE kind != 'aer' AND time_unix_ns >= ?1 AND (?2 IS NULL OR bdf = ?2)
                 GROUP BY bdf, kind ORDER BY bdf, kind",
            )
            .map_err(|source| self.error(source))?;
        let others = others
            .query_map(params![since, filter.bdf], |row| {
                Ok(KindCount {
                    bdf: row.get(0)?,
                    kind: row.get(1)?,
                    events: row.get::<_, i64>(2)? as u64,
                })
            })
            .map_err(|source| self.error(source))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| self.error(source))?;
        Ok(Summary { errors, others })
    }

    /// How many events the store holds.
    pub fn count(&self) -> Result<u64, StoreError> {
        self.connection
            .query_row("SELECT count(*) FROM events", [], |row| {
                row.get::<_, i64>(0)
            })
            .map(|count| count as u64)
            .map_err(|source| self.error(source))
    }

    /// The newest event's wall-clock time.
    pub fn newest_time(&self) -> Result<Option<i64>, StoreError> {
        self.connection
            .query_row("SELECT max(time_unix_ns) FROM events", [], |row| row.get(0))
            .optional()
            .map(Option::flatten)
            .map_err(|source| self.error(source))
    }
}

/// The typed error for what SQLite said about `path`.
fn store_error(path: &Path, source: rusqlite::Error) -> StoreError {
    let path = path.to_path_buf();
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::NotSqlite { path },
        Some(ErrorCode::DiskFull) => StoreError::DiskFull { path },
        Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
            StoreError::ReadOnly {
                path,
                error: source,
            }
        }
        _ => StoreError::Sqlite {
            path,
            error: source,
        },
    }
}

/// `/proc/sys/kernel/random/boot_id`: this boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Reads the boot id (see `StoreContext::boot_id`).
pub fn read_boot_id(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_string())
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now (see `StoreContext`).
pub fn realtime_offset_ns() -> i64 {
    use nix::time::{clock_gettime, ClockId};
    let ns = |clock| {
        clock_gettime(clock)
            .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
            .unwrap_or(0)
    };
    ns(ClockId::CLOCK_REALTIME) - ns(ClockId::CLOCK_MONOTONIC)
}

/// The class and driver of `bdf` under `<sysfs_root>/sys/bus/pci/devices`;
/// what cannot be read (a device gone, `-` for the module's overflow
/// records) is left `None`.
pub fn device_identity(sysfs_root: &Path, bdf: &str) -> DeviceIdentity {
    let dir = sysfs_root.join("sys/bus/pci/devices").join(bdf);
    DeviceIdentity {
        class: std::fs::read_to_string(dir.join("class"))
            .ok()
            .and_then(|text| parse_class(&text).ok())
            .map(|code| class_name(code).to_string()),
        driver: std::fs::read_link(dir.join("driver"))
            .ok()
            .and_then(|target| Some(target.file_name()?.to_string_lossy().into_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{aer_error_at, Event, EventKind, EventSource, Severity};

    const BOOT: &str = "boot-1";

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir =
                std::env::temp_dir().join(format!("pcieipc-store-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn row(
        source: EventSource,
        seq: u64,
        at_ns: u64,
        bdf: &str,
        step: Option<&'static str>,
    ) -> StoredEvent {
        let mut event = Event::new(source, EventKind::Aer, bdf.into(), at_ns);
        event.seq = seq;
        event.aer_step = step;
        event.errors = vec![aer_error_at(14, Severity::NonFatal, false)];
        StoredEvent::new(
            &event,
            DeviceIdentity {
                class: Some("PCI bridge".into()),
                driver: Some("pcieport".into()),
            },
            &StoreContext {
                boot_id: BOOT,
                realtime_offset_ns: 1_000_000_000_000,
            },
        )
    }

    #[test]
    fn events_and_baseline_survive_reopening_without_duplicates() {
        let dir = TempDir::new("reopen");
        let path = dir.0.join("events.db");
        let mut store = EventStore::open(&path).unwrap();
        let first = [
            row(
                EventSource::Module,
                0,
                10,
                "0000:01:00.0",
                Some("error_detected"),
            ),
            row(EventSource::Module, 1, 11, "0000:01:00.0", Some("resume")),
            row(EventSource::Tracefs, 0, 10, "0000:00:10.0", None),
        ];
        let mut baseline = CounterReadings::new();
        baseline.insert(
            ("0000:00:10.0".into(), 1),
            AerCounterFile {
                nonzero_counts: vec![("CmpltTO".into(), 2)],
                total: 2,
            },
        );
        assert_eq!(store.append(&first, Some((BOOT, &baseline))).unwrap(), 3);
        drop(store);
        // A restarted monitor reads the module's backlog again: the same
        // records add nothing; a new one does.
        let mut store = EventStore::open(&path).unwrap();
        let replay = [
            first[0].clone(),
            first[1].clone(),
            row(
                EventSource::Module,
                2,
                12,
                "0000:01:00.0",
                Some("error_detected"),
            ),
        ];
        assert_eq!(store.append(&replay, None).unwrap(), 1);
        assert_eq!(store.count().unwrap(), 4);
        assert_eq!(store.counter_baseline(BOOT).unwrap(), baseline);
        assert!(store.counter_baseline("boot-2").unwrap().is_empty());

        let reader = EventStore::open_read_only(&path).unwrap();
        let rows = reader.events(&EventFilter::default()).unwrap();
        let order: Vec<(i64, &str)> = rows
            .iter()
            .map(|r| (r.time_unix_ns, r.source.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (1_000_000_000_010, "module"),
                (1_000_000_000_010, "tracefs"),
                (1_000_000_000_011, "module"),
                (1_000_000_000_012, "module")
            ]
        );
        let port = reader
            .events(&EventFilter {
                since_unix_ns: Some(1_000_000_000_010),
                bdf: Some("0000:00:10.0".into()),
            })
            .unwrap();
        assert_eq!(port.len(), 1);
        assert_eq!(port[0].driver.as_deref(), Some("pcieport"));
        // The module's resume step is the same error as its error_detected.
        let summary = reader.summary(&EventFilter::default()).unwrap();
        let counts: Vec<(&str, &str, &str, u64)> = summary
            .errors
            .iter()
            .map(|c| {
                (
                    c.bdf.as_str(),
                    c.severity.as_str(),
                    c.error.as_str(),
                    c.reports,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [
                ("0000:00:10.0", "nonfatal", "CmpltTO", 1),
                ("0000:01:00.0", "nonfatal", "CmpltTO", 2)
            ]
        );
        assert!(summary.others.is_empty());
    }

    #[test]
    fn retention_drops_old_events_then_the_oldest_until_small_enough() {
        let dir = TempDir::new("retention");
        let mut store = EventStore::open(&dir.0.join("events.db")).unwrap();
        let rows: Vec<StoredEvent> = (0..2_000)
            .map(|i| {
                row(
                    EventSource::Counters,
                    i,
                    i * 1_000_000_000,
                    "0000:00:10.0",
                    None,
                )
            })
            .collect();
        store.append(&rows, None).unwrap();
        // Times run from 1,000 s to 2,999 s since the epoch; keep the last 1,500 s.
        let now = 3_000_000_000_000;
        let retention = store
            .enforce_retention(now, Duration::from_secs(1_500), u64::MAX)
            .unwrap();
        assert_eq!(
            retention,
            Retention {
                expired: 500,
                over_size: 0
            }
        );
        assert_eq!(store.count().unwrap(), 1_500);
        let retention = store
            .enforce_retention(now, Duration::from_secs(1_500), 64 * 1024)
            .unwrap();
        assert!(retention.over_size > 0);
        let left = store.count().unwrap();
        assert_eq!(left, 1_500 - retention.over_size);
        // The newest are the ones kept.
        assert_eq!(store.newest_time().unwrap(), Some(now - 1_000_000_000));
        let file = std::fs::metadata(dir.0.join("events.db")).unwrap().len();
        let used: i64 = store
            .connection
            .query_row(
                "SELECT (page_count - freelist_count) * page_size FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(used <= 64 * 1024, "{used} bytes used, file {file}");
    }

    #[test]
    fn files_that_are_not_stores_are_named() {
        let dir = TempDir::new("bad");
        let text = dir.0.join("notes.txt");
        std::fs::write(
            &text,
            "this is not a database, it is a long enough line of text\n".repeat(20),
        )
        .unwrap();
        let error = EventStore::open(&text).err().unwrap();
        assert!(matches!(error, StoreError::NotSqlite { .. }), "{error}");
        assert!(error
            .to_string()
            .starts_with(&format!("{}: not an SQLite database", text.display())));
        // The file is left as it was.
        assert!(std::fs::read_to_string(&text)
            .unwrap()
            .starts_with("this is not"));

        let other = dir.0.join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x);")
            .unwrap();
        let error = EventStore::open(&other).err().unwrap();
        assert!(
            matches!(error, StoreError::NotAnEventStore { found: 0, .. }),
            "{error}"
        );

        let missing = dir.0.join("missing.db");
        let error = EventStore::open_read_only(&missing).err().unwrap();
        assert!(
            error
                .to_string()
                .contains("missing.db: no event store there"),
            "{error}"
        );
        let error = EventStore::open(&dir.0.join("no-such-dir/events.db"))
            .err()
            .unwrap();
        assert!(matches!(error, StoreError::ReadOnly { .. }), "{error}");
        assert!(
            error
                .to_string()
                .contains("no-such-dir/events.db: cannot write there"),
            "{error}"
        );
    }
}
