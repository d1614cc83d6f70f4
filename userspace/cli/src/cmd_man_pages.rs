//! `pcieipc man-pages DIR`: one roff page per command, `pcieipc.1` and
//! `pcieipc-SUB.1` for each subcommand, generated from the parser's
//! definitions, so the pages say what `--help` says. scripts/build-dist.sh
//! puts them in the .deb; from the wheel, `MANPATH` can name a directory of
//! them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The directory to write the pages into (made if missing).
    dir: PathBuf,
}

pub(crate) fn run(args: Args, cli: clap::Command) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot make {}", args.dir.display()))?;
    // The parser prints the version itself (`--version` says more than a
    // number), so the command carries none; the pages' title line wants one.
    let cli = cli.version(env!("CARGO_PKG_VERSION"));
    clap_mangen::generate_to(cli, &args.dir)
        .with_context(|| format!("cannot write the man pages into {}", args.dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
