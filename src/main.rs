//! memkeep's entry point: flags and config file -> `Config`, logging, then the server.
//! Every startup failure is one line on stderr and a non-zero exit, never a panic trace.

use std::process::ExitCode;

use clap::Parser;
use memkeep::clock::Clock;
use memkeep::config::{Cli, Config};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            eprintln!(
                "memkeep: {}",
                text.lines()
                    .next()
                    .unwrap_or("invalid arguments")
                    .trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    let config = match Config::from_cli(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("memkeep: {e}");
            return ExitCode::from(2);
        }
    };
    let level = match config.verbosity {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let clock = match cli.debug_clock {
        Some(ms) => Clock::manual(ms),
        None => Clock::System,
    };
    match memkeep::server::run(config, clock) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memkeep: {e}");
            ExitCode::from(1)
        }
    }
}
