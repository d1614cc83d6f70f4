//! The events the page puts on its time strip: the JSON lines `pcieipc
//! monitor --json` prints (`events::Event` serialised), read back. Only the
//! fields the strip shows are read and the rest is ignored, so lines of every
//! source (module, tracefs, counters) and of builds before `source` existed
//! all load.

use serde::Deserialize;

use pcieipc::events::speed_gts;

/// One line of `pcieipc monitor --json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MonitorEvent {
    pub seq: u64,
    /// CLOCK_MONOTONIC, nanoseconds.
    pub timestamp_ns: u64,
    /// `aer`, `link_change`, `link_retrain`, `device_gone`, `reset`, `overflow`.
    pub kind: String,
    /// "dddd:bb:dd.f", or "-" for none.
    pub bdf: String,
    /// `module`, `tracefs` or `counters`; absent in lines of older builds.
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub errors: Vec<MonitorAerError>,
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub aer_step: Option<String>,
    /// Link events of tracefs: why the kernel updated the link.
    #[serde(default)]
    pub reason: Option<String>,
    /// Counters: errors counted since the previous poll.
    #[serde(default)]
    pub occurrences: Option<u64>,
    /// Overflow: events the module dropped.
    #[serde(default)]
    pub lost: Option<u64>,
    #[serde(default)]
    pub link_after: Option<MonitorLink>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MonitorAerError {
    pub short: String,
    /// `correctable`, `non_fatal` or `fatal`.
    pub severity: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MonitorLink {
    /// Generation: 1 = 2.5 GT/s ... 6 = 64 GT/s; 0 unknown.
    pub speed: u8,
    pub width: u8,
    #[serde(default)]
    pub degraded: bool,
}

/// A line that is not an event; the JSON error is its source.
#[derive(Debug, thiserror::Error)]
#[error("line {line}")]
pub struct MonitorLinesError {
    pub line: usize,
    pub source: serde_json::Error,
}

/// The events of `pcieipc monitor --json` output; blank lines are skipped.
pub fn parse_monitor_lines(text: &str) -> Result<Vec<MonitorEvent>, MonitorLinesError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line).map_err(|source| MonitorLinesError {
                line: number + 1,
                source,
            })
        })
        .collect()
}

impl MonitorEvent {
    /// The most severe of its AER errors: `fatal`, `non_fatal`, `correctable`.
    pub fn worst_severity(&self) -> Option<&str> {
        ["fatal", "non_fatal", "correctable"]
            .into_iter()
            .find(|severity| self.errors.iter().any(|error| error.severity == *severity))
    }

    /// Whether the link it reports came out degraded.
    pub fn degrades_link(&self) -> bool {
        self.link_after.as_ref().is_some_and(|link| link.degraded)
    }

    /// One line: what happened, without the time and device.
    pub fn describe(&self) -> String {
        let mut text = match self.kind.as_str() {
            "aer" => {
                let errors: Vec<String> = self
                    .errors
                    .iter()
                    .map(|error| format!("{} ({})", error.short, error.severity.replace('_', "-")))
                    .collect();
                let mut text = "AER".to_string();
                if let Some(step) = &self.aer_step {
                    text += &format!(" {step}");
                }
                if !errors.is_empty() {
                    text += &format!(": {}", errors.join(", "));
                }
                text
            }
            "link_change" => "link change".to_string(),
            "link_retrain" => "link retrain".to_string(),
            "device_gone" => "device gone".to_string(),
            "reset" => "reset".to_string(),
            "overflow" => format!("overflow: {} events lost", self.lost.unwrap_or(0)),
            other => other.replace('_', " "),
        };
        if let Some(count) = self.occurrences {
            text += &format!(" x{count}");
        }
        if let Some(link) = &self.link_after {
            text += &format!(" -> {} x{}", speed_gts(link.speed), link.width);
            if link.degraded {
                text += " DEGRADED";
            }
        }
        if let Some(reason) = &self.reason {
            text += &format!(" ({reason})");
        }
        if let Some(result) = self.result.as_ref().filter(|_| self.kind != "aer") {
            text += &format!(" -> {result}");
        }
        if let Some(source) = &self.source {
            text += &format!(" [{source}]");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_module_tracefs_and_counters_lines() {
        let text = r#"{"seq":3,"timestamp_ns":1500000000,"kind":"aer","bdf":"0000:8a:00.0","aer_step":"cor_error_detected","channel_state":"normal","result":"none","errors":[{"bit":0,"name":"Receiver Error","short":"RxErr","severity":"correctable","masked":false},{"bit":14,"name":"Completion Timeout","short":"CmpltTO","severity":"non_fatal","masked":false}],"aer_source":"0000:8a:00.0","source":"module"}

{"seq":0,"timestamp_ns":2000000000,"kind":"link_change","bdf":"0000:08:00.0","link_after":{"bdf":"0000:08:00.0","upstream_port":"0000:02:01.0","speed":4,"width":8,"max_speed":4,"max_width":16,"target_speed":0,"degraded":true,"training":false,"dll_link_active":true,"device_pcie":false,"port_lnkcap":0,"port_lnksta":0,"port_lnkctl":0,"port_lnkctl2":0,"device_lnkcap":0,"device_lnksta":0},"reason":"bwctrl_irq","source":"tracefs"}
{"seq":1,"timestamp_ns":2500000000,"kind":"aer","bdf":"0000:8a:00.0","errors":[{"bit":6,"name":"Bad TLP","short":"BadTLP","severity":"correctable","masked":false}],"occurrences":37,"source":"counters"}
{"seq":9,"timestamp_ns":2600000000,"kind":"overflow","bdf":"-","lost":4}
"#;
        let events = parse_monitor_lines(text).unwrap();
        let described: Vec<(u64, String)> = events
            .iter()
            .map(|event| (event.timestamp_ns, event.describe()))
            .collect();
        assert_eq!(
            described,
            [
                (
                    1_500_000_000,
                    "AER cor_error_detected: RxErr (correctable), CmpltTO (non-fatal) [module]"
                        .to_string()
                ),
                (
                    2_000_000_000,
                    "link change -> 16GT/s x8 DEGRADED (bwctrl_irq) [tracefs]".to_string()
                ),
                (
                    2_500_000_000,
                    "AER: BadTLP (correctable) x37 [counters]".to_string()
                ),
                (2_600_000_000, "overflow: 4 events lost".to_string()),
            ]
        );
        assert_eq!(events[0].worst_severity(), Some("non_fatal"));
        assert_eq!(events[2].worst_severity(), Some("correctable"));
        assert_eq!(events[3].worst_severity(), None);
        assert!(events[1].degrades_link());
        assert!(!events[0].degrades_link());
    }

    #[test]
    fn a_malformed_line_is_named() {
        let text = "{\"seq\":1,\"timestamp_ns\":5,\"kind\":\"reset\",\"bdf\":\"-\"}\n{\"seq\":2}\n";
        let error = parse_monitor_lines(text).unwrap_err();
        assert_eq!(error.line, 2);
        assert_eq!(error.to_string(), "line 2");
        let cause = error.source.to_string();
        assert!(cause.starts_with("missing field `timestamp_ns`"), "{cause}");
    }
}
