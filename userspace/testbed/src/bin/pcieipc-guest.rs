//! `pcieipc-guest`: checks run inside a testbed guest.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use pcieipc_testbed::tree::{compare, scan, TreeLine};

#[derive(Parser)]
#[command(name = "pcieipc-guest", about = "Checks run inside a pcieipc testbed guest")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compare the PCI tree under the root ports with the expected tree.
    Tree {
        /// Expected tree (the harness writes /testbed/expected-tree.txt).
        #[arg(long, default_value = "/testbed/expected-tree.txt")]
        expect: PathBuf,
        #[arg(long, default_value = "/sys")]
        sysfs: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Tree { expect, sysfs } => {
            let expected: Result<Vec<TreeLine>, String> = match std::fs::read_to_string(&expect) {
                Ok(text) => text.lines().filter(|l| !l.trim().is_empty()).map(str::parse).collect(),
                Err(e) => Err(format!("{}: {e}", expect.display())),
            };
            let expected = match expected {
                Ok(lines) => lines,
                Err(e) => {
                    eprintln!("pcieipc-guest: {e}");
                    return ExitCode::from(2);
                }
            };
            let actual = match scan(&sysfs) {
                Ok(lines) => lines,
                Err(e) => {
                    eprintln!("pcieipc-guest: {e}");
                    return ExitCode::from(2);
                }
            };
            for line in &actual {
                println!("{line}");
            }
            let problems = compare(&expected, &actual);
            for problem in &problems {
                eprintln!("pcieipc-guest: tree: {problem}");
            }
            if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
