//! `pcieipc bench --json` and `--cold-start --json` print reports that their
//! schemas (docs/schemas) accept, with the values a run of this host gives.

use std::process::Command;

fn report(args: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_pcieipc"))
        .args(["bench", "--nranks", "2", "--json"])
        .args(args)
        .output()
        .expect("run pcieipc bench");
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON report")
}

fn assert_valid(report: &serde_json::Value, schema_file: &str) {
    let path = format!(
        "{}/../../docs/schemas/{schema_file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let schema: serde_json::Value = serde_json::from_str(&text).expect("schema JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid schema");
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{schema_file}: {errors:#?}\n{report:#}");
}

#[test]
fn the_sweeps_report_matches_its_schema() {
    let report = report(&["-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1"]);
    assert_valid(&report, "bench-v1.schema.json");
    assert_eq!(report["wrong"], 0);
    let sizes: Vec<u64> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|row| row["size_bytes"].as_u64().expect("size"))
        .collect();
    assert_eq!(sizes, [8, 512, 32768]);
    assert!(report["first_call_ms"].as_f64().expect("first call") > 0.0);
    // Without --latency the timed calls read no clock between them, and
    // the report has no per-call distribution; a host transport crosses no
    // GPU link to host memory.
    assert!(report.get("host_links").is_none(), "{report}");
    for row in report["results"].as_array().unwrap() {
        for placement in ["out_of_place", "in_place"] {
            assert!(row[placement].get("latency_us").is_none(), "{row}");
            assert!(row[placement].get("link_utilisation").is_none(), "{row}");
        }
    }
}

/// The fields `--transport cuda` through host memory adds (a GPU's measured
/// link, each row's use of it), on this host's report: the schema takes
/// them as the bench writes them and refuses them malformed.
#[test]
fn the_link_to_host_memory_fields_match_the_schema() {
    let mut report = report(&["-b", "8", "-e", "8", "-n", "2", "-w", "1"]);
    report["host_links"] = serde_json::json!([{
        "gpu": 0,
        "pci_address": "0000:18:00.0",
        "ranks": [0, 1],
        "to_gpu_gb_s": 55.1,
        "from_gpu_gb_s": 54.8,
        "both_to_gpu_gb_s": 50.2,
        "both_from_gpu_gb_s": 49.9,
        "limit_gb_s": 49.9,
    }]);
    for placement in ["out_of_place", "in_place"] {
        report["results"][0][placement]["link_utilisation"] = serde_json::json!(0.83);
    }
    assert_valid(&report, "bench-v1.schema.json");
    let schema = std::fs::read_to_string(format!(
        "{}/../../docs/schemas/bench-v1.schema.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let validator =
        jsonschema::validator_for(&serde_json::from_str(&schema).unwrap()).expect("a valid schema");
    for (field, bad) in [
        ("pci_address", serde_json::json!("18:00.0")),
        ("ranks", serde_json::json!([])),
        ("limit_gb_s", serde_json::json!(-1.0)),
    ] {
        let mut broken = report.clone();
        broken["host_links"][0][field] = bad;
        assert!(!validator.is_valid(&broken), "{field} accepted: {broken}");
    }
    let mut unlimited = report.clone();
    unlimited["host_links"][0]
        .as_object_mut()
        .unwrap()
        .remove("limit_gb_s");
    assert!(!validator.is_valid(&unlimited));
}

#[test]
fn every_size_reports_its_per_call_distribution() {
    let report = report(&[
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "64",
        "-n",
        "50",
        "-w",
        "1",
        "--latency",
    ]);
    assert_valid(&report, "bench-v1.schema.json");
    for row in report["results"].as_array().expect("results") {
        for placement in ["out_of_place", "in_place"] {
            let measured = &row[placement];
            let latency = &measured["latency_us"];
            assert_eq!(latency["calls"], 50, "{row}");
            let stat = |name: &str| latency[name].as_f64().expect(name);
            let ladder = ["p50", "p90", "p99", "p99_7", "max"].map(stat);
            assert!(ladder[0] > 0.0, "{row}");
            assert!(ladder.windows(2).all(|pair| pair[0] <= pair[1]), "{row}");
            // The calls are those the mean time is of: the slowest rank's
            // calls average at least the ranks' mean, less what that mean
            // also covers outside the calls' stamps (the loop's own clock
            // reads before the first call and after the last: allowed 1 µs
            // a loop, spread over its 50 calls). At 8 bytes a call takes
            // 0.25 µs, and 1% of it (2.5 ns) was once less than that share.
            let outside_the_stamps_us = 1.0 / 50.0;
            assert!(
                stat("mean")
                    >= measured["time_us"].as_f64().unwrap() * 0.99 - outside_the_stamps_us,
                "{row}"
            );
            assert!(
                stat("mean") <= stat("max") && stat("stddev") >= 0.0,
                "{row}"
            );
        }
    }
}

#[test]
fn the_cold_start_report_matches_its_schema() {
    let report = report(&["--cold-start", "-b", "64K", "-e", "128K", "-n", "8"]);
    assert_valid(&report, "bench-cold-start-v1.schema.json");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for row in results {
        let calls = row["calls_us"].as_array().expect("calls");
        let faults = row["page_faults"].as_array().expect("faults");
        assert_eq!((calls.len(), faults.len()), (8, 8), "{row}");
        let to_steady = row["calls_to_steady"].as_u64().expect("calls to steady");
        assert!((1..=8).contains(&to_steady), "{row}");
        // The first call at a size backs its slots (engine/comm/streams.rs):
        // it takes the faults, the seven calls after it fewer together (left
        // to the calls, each of the next four faulted in a slot of its own,
        // as many as the first). Not none: the count is the thread's, and a
        // path run for the first time under load (a futex sleep) faults in
        // its code and stack pages.
        let first = faults[0].as_f64().unwrap();
        let after: f64 = faults[1..].iter().map(|f| f.as_f64().unwrap()).sum();
        assert!(first > 0.0 && after < first, "{row}");
    }
}
