//! Per-call latency distributions of `pcieipc bench`: the percentiles a
//! training step pays (it waits for its slowest all-reduce), not only the
//! mean nccl-tests reports, and the per-call times of a peer's run (the
//! OpenMPI program's `--latency` lines) to set beside them. Pure: samples or
//! text in, numbers out.

use serde_json::{json, Value};

/// The percentiles every report gives, as (name, percent).
pub const PERCENTILES: [(&str, f64); 4] =
    [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_7", 99.7)];

/// The distribution of one size's timed calls, microseconds per call.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub calls: usize,
    /// `PERCENTILES`' values, in their order.
    pub percentiles: [f64; 4],
    pub max: f64,
    pub mean: f64,
    /// The population standard deviation.
    pub stddev: f64,
}

impl Distribution {
    /// `None` without samples. Percentiles are nearest-rank (the smallest
    /// sample with at least p% of the samples at or below it), so each is a
    /// call that happened: with fewer than 334 calls p99.7 is the maximum.
    pub fn of(samples_us: &[f64]) -> Option<Distribution> {
        if samples_us.is_empty() {
            return None;
        }
        let mut sorted = samples_us.to_vec();
        sorted.sort_by(f64::total_cmp);
        let calls = sorted.len();
        let rank = |percent: f64| {
            // In thousandths, so that 99.7% of 1000 is 997 and not 996.99…
            let thousandths = (percent * 10.0).round() as usize;
            (calls * thousandths).div_ceil(1000).clamp(1, calls) - 1
        };
        let percentiles = PERCENTILES.map(|(_, percent)| sorted[rank(percent)]);
        let mean = sorted.iter().sum::<f64>() / calls as f64;
        let variance = sorted.iter().map(|us| (us - mean).powi(2)).sum::<f64>() / calls as f64;
        Some(Distribution {
            calls,
            percentiles,
            max: sorted[calls - 1],
            mean,
            stddev: variance.sqrt(),
        })
    }

    pub fn p50(&self) -> f64 {
        self.percentiles[0]
    }

    pub fn json(&self) -> Value {
        let mut object = json!({
            "calls": self.calls,
            "max": self.max,
            "mean": self.mean,
            "stddev": self.stddev,
        });
        for ((name, _), value) in PERCENTILES.iter().zip(self.percentiles) {
            object[*name] = json!(value);
        }
        object
    }
}

/// Out of place or in place, as reports name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    OutOfPlace,
    InPlace,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::OutOfPlace => "out of place",
            Placement::InPlace => "in place",
        }
    }
}

/// One size and placement of a peer's run: every timed call's time, the
/// slowest rank's.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerCalls {
    pub size_bytes: usize,
    pub placement: Placement,
    pub calls_us: Vec<f64>,
}

/// A peer's per-call file that cannot be read as one.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PeerCallsError {
    #[error("line {line}: {what} (expected \"calls SIZE oop|ip T1 ... TN\", times in us)")]
    Malformed { line: usize, what: String },
    #[error(
        "no \"calls\" lines: not the output of bench/mpi_allreduce --latency or bench/nccl_allreduce.py --latency"
    )]
    Empty,
}

/// The `calls SIZE oop|ip T1 ... TN` lines of a peer's output (other lines,
/// its table and comments, are skipped).
pub fn parse_peer_calls(text: &str) -> Result<Vec<PeerCalls>, PeerCallsError> {
    let mut series = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut fields = line.split_whitespace();
        if fields.next() != Some("calls") {
            continue;
        }
        let malformed = |what: String| PeerCallsError::Malformed {
            line: index + 1,
            what,
        };
        let size_bytes = fields
            .next()
            .and_then(|size| size.parse().ok())
            .ok_or_else(|| malformed("no size in bytes".to_owned()))?;
        let placement = match fields.next() {
            Some("oop") => Placement::OutOfPlace,
            Some("ip") => Placement::InPlace,
            other => return Err(malformed(format!("placement {other:?}"))),
        };
        let calls_us = fields
            .map(|field| match field.parse::<f64>() {
                Ok(us) if us.is_finite() && us >= 0.0 => Ok(us),
                _ => Err(malformed(format!("{field:?} is not a time"))),
            })
            .collect::<Result<Vec<f64>, _>>()?;
        if calls_us.is_empty() {
            return Err(malformed("no call times".to_owned()));
        }
        series.push(PeerCalls {
            size_bytes,
            placement,
            calls_us,
        });
    }
    if series.is_empty() {
        return Err(PeerCallsError::Empty);
    }
    Ok(series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_calls() {
        // 1..=1000 us: p50 the 500th, p90 the 900th, p99 the 990th, p99.7 the 997th.
        let samples: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let d = Distribution::of(&samples).unwrap();
        assert_eq!(d.calls, 1000);
        assert_eq!(d.percentiles, [500.0, 900.0, 990.0, 997.0]);
        assert_eq!(d.max, 1000.0);
        assert_eq!(d.mean, 500.5);
        // The population standard deviation of 1..=n: sqrt((n^2 - 1) / 12).
        assert!((d.stddev - ((1000.0f64 * 1000.0 - 1.0) / 12.0).sqrt()).abs() < 1e-9);
    }

    #[test]
    fn few_calls_make_the_high_percentiles_the_maximum() {
        let d = Distribution::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(d.percentiles, [2.0, 10.0, 10.0, 10.0]);
        let one = Distribution::of(&[7.0]).unwrap();
        assert_eq!((one.percentiles, one.stddev), ([7.0; 4], 0.0));
        assert_eq!(Distribution::of(&[]), None);
    }

    #[test]
    fn one_slow_call_in_a_thousand_is_past_p99_7_but_three_reach_it() {
        let mut samples = vec![1.0; 1000];
        samples[17] = 50.0;
        let d = Distribution::of(&samples).unwrap();
        assert_eq!((d.percentiles[3], d.max), (1.0, 50.0));
        samples[400] = 40.0;
        samples[900] = 30.0;
        samples[901] = 30.0;
        assert_eq!(Distribution::of(&samples).unwrap().percentiles[3], 30.0);
    }

    #[test]
    fn json_names_every_percentile() {
        let value = Distribution::of(&[1.0, 2.0]).unwrap().json();
        for key in [
            "calls", "p50", "p90", "p99", "p99_7", "max", "mean", "stddev",
        ] {
            assert!(value.get(key).is_some(), "{key} in {value}");
        }
        assert_eq!(value["p50"], 1.0);
        assert_eq!(value["p99_7"], 2.0);
    }

    #[test]
    fn peer_calls_parse_and_skip_the_table() {
        let text = "#       size   oop time\n\
                    8 0.5 0.1 0.5 0.1\n\
                    calls 8 oop 0.5 0.6 0.7\n\
                    calls 8 ip 0.4 0.4\n";
        let series = parse_peer_calls(text).unwrap();
        assert_eq!(
            series,
            [
                PeerCalls {
                    size_bytes: 8,
                    placement: Placement::OutOfPlace,
                    calls_us: vec![0.5, 0.6, 0.7]
                },
                PeerCalls {
                    size_bytes: 8,
                    placement: Placement::InPlace,
                    calls_us: vec![0.4, 0.4]
                },
            ]
        );
    }

    #[test]
    fn peer_calls_refuse_what_is_not_one() {
        assert_eq!(parse_peer_calls("8 0.5\n"), Err(PeerCallsError::Empty));
        let bad = |text: &str| match parse_peer_calls(text) {
            Err(PeerCallsError::Malformed { line, what }) => (line, what),
            other => panic!("{text:?}: {other:?}"),
        };
        assert_eq!(bad("calls x oop 1").1, "no size in bytes");
        assert_eq!(bad("calls 8 sideways 1").1, "placement Some(\"sideways\")");
        assert_eq!(bad("# a\ncalls 8 ip").0, 2);
        assert_eq!(bad("calls 8 ip 1 -2").1, "\"-2\" is not a time");
        assert_eq!(bad("calls 8 ip 1 NaN").1, "\"NaN\" is not a time");
    }
}
