//! The `outpost` binary: parse flags, assemble the components, run. Everything of substance lives
//! in the library crates (`outpost-proxy` first); this file only dispatches.
//!
//! Exit codes: 0 on a clean stop, 2 for configuration and start-up errors (one line on stderr
//! naming the problem), 1 for failures at run time.

mod cache_cmd;
mod cli;
#[cfg(feature = "demo")]
mod demo;
mod private;
mod run;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cli.command {
        #[cfg(feature = "demo")]
        Some(cli::Command::Demo) => demo::main(),
        Some(cli::Command::Node { command }) => node(*command),
        Some(cli::Command::Cache { command }) => {
            private::restrict_umask();
            cache_cmd::main(*command)
        }
        None => {
            // Before any thread starts: the umask is the process's, and the hub's files are
            // the node's secrets.
            private::restrict_umask();
            run::hub(&cli.hub)
        }
    }
}

/// `outpost node convert|revert`: progress on stdout; refusals exit 2, other failures 1.
fn node(command: cli::NodeCommand) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let result = match command {
        cli::NodeCommand::Convert(args) => outpost_node::convert(&args, &mut stdout),
        cli::NodeCommand::Revert(args) => outpost_node::revert(&args, &mut stdout),
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outpost: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
