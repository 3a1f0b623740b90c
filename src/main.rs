//! `synapse`: parse, run, map errors to exit codes.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match synapse::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { 2 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SYNAPSE_LOG").unwrap_or_else(|_| "warn,synapse=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match synapse::cli::run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            let message = format!("{error:#}");
            if message.starts_with("Error") || message.starts_with("Warning") {
                eprintln!("{message}");
            } else {
                eprintln!("Error: {message}");
            }
            ExitCode::from(1)
        }
    }
}
