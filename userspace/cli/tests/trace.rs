//! `pcieipc bench --trace`, `pcieipc trace -- <command>` and `pcieipc trace
//! summary`: the file parses as trace-event JSON, has a track per rank,
//! every step and wait lies inside a call of its own rank, and the summary
//! names the slowest step and gives every call of the tail one cause.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn pcieipc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pcieipc"))
}

/// Ring sizes (64 KiB and 1 MiB: the ring's send, reduce and copy steps)
/// and a one-shot size (8 B), 2 ranks that sleep at once when they wait
/// (so the trace has sleeps and the wakes that end them).
const BENCH: [&str; 16] = [
    "bench",
    "--spin-us",
    "0",
    "--nranks",
    "2",
    "-b",
    "8",
    "-e",
    "1M",
    "-f",
    "128",
    "-n",
    "3",
    "-w",
    "1",
    "-c1",
];

struct Span {
    pid: u64,
    name: String,
    category: String,
    start: f64,
    end: f64,
}

fn spans(file: &Path) -> (Vec<Span>, Vec<Value>) {
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).expect("the trace is JSON");
    let events = trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .clone();
    let spans = events
        .iter()
        .filter(|event| event["ph"] == "X")
        .map(|event| {
            let start = event["ts"].as_f64().expect("ts");
            Span {
                pid: event["pid"].as_u64().expect("pid"),
                name: event["name"].as_str().expect("name").to_owned(),
                category: event["cat"].as_str().expect("cat").to_owned(),
                start,
                end: start + event["dur"].as_f64().expect("dur"),
            }
        })
        .collect();
    (spans, events)
}

fn check_trace(file: &Path) {
    let (spans, events) = spans(file);
    let tracks: Vec<(u64, &str)> = events
        .iter()
        .filter(|event| event["ph"] == "M" && event["name"] == "process_name")
        .map(|event| {
            (
                event["pid"].as_u64().unwrap(),
                event["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(tracks.len(), 2, "one track per rank: {tracks:?}");
    for rank in 0..2u64 {
        assert!(tracks.contains(&(rank, format!("rank {rank}").as_str())));
        let calls: Vec<&Span> = spans
            .iter()
            .filter(|span| span.pid == rank && span.category == "call")
            .collect();
        assert!(
            calls.iter().any(|call| call.name == "all_reduce"),
            "rank {rank} has all_reduce calls"
        );
        assert!(
            events.iter().any(|event| event["pid"] == rank
                && event["ph"] == "i"
                && event["name"] == "futex wake"),
            "rank {rank} woke its peer at least once"
        );
        for name in ["send", "reduce", "copy"] {
            assert!(
                spans
                    .iter()
                    .any(|span| span.pid == rank && span.category == "step" && span.name == name),
                "rank {rank} has {name} steps"
            );
        }
        // Steps nest inside a call of their rank, waits inside a call or the
        // init, sleeps inside a wait.
        let inside = |span: &Span, outer: &str| {
            spans.iter().any(|candidate| {
                candidate.pid == span.pid
                    && candidate.category == outer
                    && candidate.start <= span.start
                    && span.end <= candidate.end
            })
        };
        for span in spans.iter().filter(|span| span.pid == rank) {
            match span.category.as_str() {
                "step" => assert!(
                    inside(span, "call"),
                    "rank {rank}: {} at {} is outside every call",
                    span.name,
                    span.start
                ),
                "wait" => assert!(
                    inside(span, "call") || inside(span, "init"),
                    "rank {rank}: {} at {} is outside every call",
                    span.name,
                    span.start
                ),
                "sleep" => assert!(inside(span, "wait"), "a sleep outside every wait"),
                _ => {}
            }
            assert!(span.end >= span.start);
        }
        // Calls follow each other: none starts before the previous ended.
        for pair in calls.windows(2) {
            assert!(pair[0].end <= pair[1].start || pair[1].end <= pair[0].start);
        }
    }
}

#[test]
fn bench_trace_has_a_track_per_rank_with_nested_spans_and_a_summary() {
    let dir = tempfile_dir("bench");
    let file = dir.join("bench.json");
    let output = pcieipc()
        .args(BENCH)
        .arg("--trace")
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    check_trace(&file);
    let summary = pcieipc()
        .args(["trace", "summary"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(summary.status.success(), "{summary:?}");
    let text = String::from_utf8(summary.stdout).unwrap();
    for line in ["rank 0: ", "rank 1: ", "slowest step: rank "] {
        assert!(text.contains(line), "summary lacks {line:?}:\n{text}");
    }
    assert!(
        text.contains("  reduce ") && text.contains("  send "),
        "{text}"
    );
    // The tail: every numbered call of the job counted once, and each call
    // at or above p99.7 given one cause.
    let (_, events) = spans(&file);
    let numbered: std::collections::BTreeSet<i64> = events
        .iter()
        .filter(|event| event["ph"] == "X" && event["cat"] == "call")
        .filter_map(|event| event["args"]["call"].as_i64())
        .collect();
    let tail_line = text
        .lines()
        .find(|line| line.starts_with("calls: "))
        .unwrap_or_else(|| panic!("no tail in the summary:\n{text}"));
    assert!(
        tail_line.starts_with(&format!("calls: {}, median ", numbered.len())),
        "{tail_line}\n{text}"
    );
    let at_or_above: usize = tail_line
        .rsplit("the ")
        .next()
        .and_then(|rest| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("{tail_line}"));
    let causes = [
        "a peer began the call late",
        "waiting on a peer",
        "a step with no wait inside took long",
        "time in no step or wait",
    ];
    let counted: usize = text
        .lines()
        .filter(|line| causes.iter().any(|cause| line.trim_start().contains(cause)))
        .filter_map(|line| line.split_whitespace().next()?.parse::<usize>().ok())
        .sum();
    assert!(at_or_above >= 1, "{text}");
    assert_eq!(counted, at_or_above, "{text}");
    // The picture: both ranks' bands, and the last two 1 MiB calls' spans.
    let picture = dir.join("bench.svg");
    let drawn = pcieipc()
        .args(["trace", "--calls", "2", "-o"])
        .arg(&picture)
        .arg("svg")
        .arg(&file)
        .output()
        .unwrap();
    assert!(drawn.status.success(), "{drawn:?}");
    let svg = std::fs::read_to_string(&picture).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("rank 0") && svg.contains("rank 1"));
    assert!(svg.contains("(2 calls of rank 0)"), "{svg}");
    assert!(svg.matches("<rect x=").count() >= 8, "{svg}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn trace_runs_a_command_merges_its_ranks_and_keeps_its_exit_status() {
    let dir = tempfile_dir("command");
    let file = dir.join("job.json");
    let output = pcieipc()
        .args(["trace", "-o"])
        .arg(&file)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_pcieipc"))
        .args(BENCH)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    check_trace(&file);
    assert!(String::from_utf8(output.stdout)
        .unwrap()
        .contains("slowest step"));
    // A failing command's status comes back, and a command that made no
    // communicator is said to have written no trace.
    let failed = pcieipc()
        .args(["trace", "-o"])
        .arg(dir.join("none.json"))
        .args(["--", "false"])
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&failed.stderr).contains("no rank wrote a trace"));
    // A command that wrote a trace and then failed: the trace is merged and
    // summarised, and its own status (3) comes back.
    let traced_then_failed = dir.join("failed.json");
    let script = "\"$0\" \"$@\" > /dev/null && exit 3";
    let output = pcieipc()
        .args(["trace", "-o"])
        .arg(&traced_then_failed)
        .args(["--", "sh", "-c", script, env!("CARGO_BIN_EXE_pcieipc")])
        .args(BENCH)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    check_trace(&traced_then_failed);
    assert!(String::from_utf8(output.stdout)
        .unwrap()
        .contains("slowest step"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn summary_of_a_file_that_is_not_a_trace_names_it() {
    let dir = tempfile_dir("bad");
    let file = dir.join("bad.json");
    std::fs::write(&file, "{\"traceEvents\": 3}").unwrap();
    let output = pcieipc()
        .args(["trace", "summary"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.json is not a trace") && stderr.contains("traceEvents"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

fn tempfile_dir(test: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("pcieipc-trace-test-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
