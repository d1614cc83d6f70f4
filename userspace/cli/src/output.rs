//! What the commands write besides their results.

use std::io::Write;

/// Writes `line` and a newline to stderr in one write: the ranks of a bench
/// job share their parent's stderr, and `eprintln!` writes each formatted
/// piece apart, so two ranks' errors interleaved mid-line.
pub(crate) fn eprint_line(line: &str) {
    // Nothing sensible is left to do when stderr itself fails.
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
