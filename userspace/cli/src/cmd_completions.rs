//! `pcieipc completions SHELL`: the shell's completion script for every
//! subcommand and flag, generated from the same definitions the parser uses,
//! so it cannot fall behind them. The .deb installs bash's, zsh's and fish's.

use std::process::ExitCode;

use clap_complete::Shell;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The shell to write the script for.
    shell: Shell,
}

pub(crate) fn run(args: Args, mut cli: clap::Command) -> anyhow::Result<ExitCode> {
    let name = cli.get_name().to_owned();
    clap_complete::generate(args.shell, &mut cli, name, &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
