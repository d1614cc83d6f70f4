//! `pcieipc trace`: runs a command with tracing on (every communicator it
//! makes records its rank's timeline), merges the ranks' files into one
//! trace-event JSON file for Perfetto UI or chrome://tracing, and prints a
//! summary; `pcieipc trace summary FILE` summarises a trace made earlier,
//! `pcieipc trace svg FILE` draws its last calls as an SVG timeline.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};
use clap::Parser;
use pcieipc::trace::{self, TRACE_ENV};

#[derive(Parser)]
#[command(
    about = "Record a job's timeline (Chrome trace-event JSON) or summarise one",
    after_help = "Examples:\n  pcieipc trace -o bench.json -- pcieipc bench --nranks 2 -b 1M -e 1M\n  pcieipc trace summary bench.json\n  pcieipc trace -o bench.svg svg bench.json   (the last --calls calls as an SVG timeline)"
)]
pub struct Args {
    /// The merged trace to write (with `svg`: the picture).
    #[arg(short, long, value_name = "FILE", default_value = "pcieipc-trace.json")]
    output: PathBuf,
    /// With `svg`: how many of the lowest rank's last calls to draw.
    #[arg(long, value_name = "N", default_value_t = 3)]
    calls: usize,
    /// `summary FILE`, `svg FILE`, or the command to run traced (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.command.first().map(String::as_str) == Some("summary") {
        let [_, file] = &args.command[..] else {
            bail!("usage: pcieipc trace summary FILE");
        };
        print!("{}", summarise(Path::new(file))?);
        return Ok(ExitCode::SUCCESS);
    }
    if args.command.first().map(String::as_str) == Some("svg") {
        let [_, file] = &args.command[..] else {
            bail!("usage: pcieipc trace -o OUT.svg [--calls N] svg FILE");
        };
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        let svg = crate::trace_svg::timeline_svg(&text, args.calls)
            .with_context(|| format!("{file} is not a trace"))?;
        std::fs::write(&args.output, svg)
            .with_context(|| format!("writing {}", args.output.display()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let parts = TraceParts::new()?;
    let status = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env(TRACE_ENV, parts.prefix())
        .status()
        .with_context(|| format!("running {}", args.command[0]))?;
    let ranks = parts.merge_into(&args.output)?;
    print!("{}", summarise(&args.output)?);
    crate::output::eprint_line(&format!(
        "pcieipc trace: {} ({ranks} ranks)",
        args.output.display()
    ));
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(status.code().map_or(2, |code| code.clamp(1, 255) as u8))
    })
}

fn summarise(file: &Path) -> anyhow::Result<trace::Summary> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    trace::summarise(&text).with_context(|| format!("{} is not a trace", file.display()))
}

/// A directory the ranks of one traced job write their files into,
/// removed when dropped.
pub(crate) struct TraceParts {
    dir: PathBuf,
}

impl TraceParts {
    /// A new private directory (mode 0700, a name nobody can guess ahead,
    /// made by mkdtemp): the ranks' files in a shared temporary directory
    /// are neither readable by others nor replaceable by a planted link.
    pub(crate) fn new() -> anyhow::Result<TraceParts> {
        let template = std::env::temp_dir().join("pcieipc-trace-XXXXXX");
        let dir = nix::unistd::mkdtemp(&template)
            .with_context(|| format!("creating a directory {}", template.display()))?;
        Ok(TraceParts { dir })
    }

    /// The prefix to hand the ranks (`PCIEIPC_TRACE`).
    pub(crate) fn prefix(&self) -> PathBuf {
        self.dir.join("job")
    }

    /// Merges every rank's file into `output`; returns how many there were.
    pub(crate) fn merge_into(&self, output: &Path) -> anyhow::Result<usize> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .with_context(|| format!("reading {}", self.dir.display()))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .collect();
        files.sort();
        if files.is_empty() {
            bail!("no rank wrote a trace (did the command make a pcieipc communicator?)");
        }
        let texts = files
            .iter()
            .map(|file| {
                std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
            })
            .collect::<anyhow::Result<Vec<String>>>()?;
        let merged = trace::merge(&texts).context("merging the ranks' traces")?;
        std::fs::write(output, merged).with_context(|| format!("writing {}", output.display()))?;
        Ok(files.len())
    }
}

impl Drop for TraceParts {
    fn drop(&mut self) {
        // Temporary files only: nothing to report if they are already gone.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_traced_job_gets_a_private_directory_of_its_own() {
        let first = TraceParts::new().unwrap();
        let second = TraceParts::new().unwrap();
        assert_ne!(first.dir, second.dir);
        for parts in [&first, &second] {
            let metadata = std::fs::symlink_metadata(&parts.dir).unwrap();
            assert!(metadata.is_dir());
            assert_eq!(
                metadata.permissions().mode() & 0o777,
                0o700,
                "{}",
                parts.dir.display()
            );
            let name = parts
                .dir
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            assert_ne!(
                name,
                format!("pcieipc-trace-{}", std::process::id()),
                "a guessable name"
            );
        }
        let dir = first.dir.clone();
        drop(first);
        assert!(!dir.exists(), "the directory outlived its job");
    }
}
