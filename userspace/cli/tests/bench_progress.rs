//! `pcieipc bench`'s progress bar: drawn on stderr when it is a terminal,
//! absent when it is not, and never in the table on stdout.

use std::fs::File;
use std::io::Read;
use std::process::{Command, Output, Stdio};

use nix::pty::{openpty, Winsize};

/// Four sizes (8 B to 512 B), so the sweep has steps to count.
fn bench() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pcieipc"));
    command
        .args(["bench", "--nranks", "2", "-b", "8", "-e", "512", "-f", "4"])
        .args(["-n", "2", "-w", "1", "--bind-to", "none"])
        .env("TERM", "xterm");
    command
}

/// The table with each measured number (those with a decimal point: times,
/// bandwidths, the init time) replaced by `#`: what a second run repeats.
/// The page-fault line, printed when a timed call happened to fault, is
/// measured too and left out.
fn shape(stdout: &[u8]) -> Vec<Vec<String>> {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with("# Page faults in timed calls"))
        .map(|line| {
            line.split_whitespace()
                .map(|token| {
                    if token.contains('.') && token.parse::<f64>().is_ok() {
                        "#".to_string()
                    } else {
                        token.to_string()
                    }
                })
                .collect()
        })
        .collect()
}

fn succeeded(output: &Output) {
    assert!(
        output.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn no_progress_where_stderr_is_not_a_terminal() {
    let output = bench().output().expect("run pcieipc bench");
    succeeded(&output);
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
    let table = shape(&output.stdout);
    assert_eq!(table.len(), 11, "{table:?}");
    assert!(table[0]
        .starts_with(&["#", "pcieipc", "bench:", "all_reduce,", "2", "ranks,"].map(String::from)));
    let sizes: Vec<&str> = table[5..9].iter().map(|row| row[0].as_str()).collect();
    assert_eq!(sizes, ["8", "32", "128", "512"]);
    assert_eq!(
        table[9],
        ["#", "Out", "of", "bounds", "values", ":", "0", "OK"]
    );
}

#[test]
fn progress_goes_to_a_terminal_and_the_table_stays_the_same() {
    let size = Winsize {
        ws_row: 24,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&size), None).expect("openpty");
    let mut command = bench();
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::from(pty.slave));
    let child = command.spawn().expect("run pcieipc bench");
    // Dropped with `command`: the terminal then ends at the child's exit.
    drop(command);
    let mut terminal = File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut drawn = Vec::new();
        // The read that follows the last writer's exit fails (EIO): the end.
        let _ = terminal.read_to_end(&mut drawn);
        drawn
    });
    let output = child.wait_with_output().expect("wait for pcieipc bench");
    succeeded(&output);
    let drawn = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    // The first size's line; later ones may fall to indicatif's rate limit
    // on a sweep this short.
    assert!(
        drawn.contains(" measuring size 1/4: 8 B (0s elapsed)"),
        "{drawn:?}"
    );

    let piped = bench().output().expect("run pcieipc bench");
    succeeded(&piped);
    assert_eq!(shape(&output.stdout), shape(&piped.stdout));
    assert!(!String::from_utf8_lossy(&output.stdout).contains('\u{1b}'));
}
