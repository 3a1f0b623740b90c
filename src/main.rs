//! `synapse`: parse, run, map errors to exit codes. This is the one place an error becomes
//! the user's `Error: ...` line: messages everywhere else say only what went wrong.

use clap::Parser;
use std::process::ExitCode;

/// The exit status of a command whose output pipe was closed (128 + SIGPIPE, as for tools
/// that die of the signal).
const CLOSED_PIPE_EXIT: i32 = 141;

fn main() -> ExitCode {
    end_quietly_on_a_closed_pipe();
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
        // Colour only on a terminal, never with NO_COLOR: the broker's and background wrappers'
        // standard error is a log file, which must hold no escape codes.
        .with_ansi(colour_allowed())
        .init();
    match synapse::cli::run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            eprintln!("{}", user_message(&format!("{error:#}")));
            ExitCode::from(1)
        }
    }
}

/// Colour for diagnostics: standard error is a terminal and `NO_COLOR` is unset or empty.
fn colour_allowed() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}

/// `synapse history stats | head -1`: once the reader has gone, printing fails and `println!`
/// panics. Such a command ends quietly instead (no panic message, status 141). Rust ignores
/// SIGPIPE so that sockets report errors instead of killing the process; that stays so, and
/// only this one panic is turned into a quiet exit.
fn end_quietly_on_a_closed_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(CLOSED_PIPE_EXIT);
        }
        default_hook(info);
    }));
}

/// The line shown for a failed command. A message that already carries its label (the broker's
/// messages did, until they lost their `Error: ` prefix; a broker of that time may still answer)
/// is shown as it is, so the label never appears twice.
fn user_message(message: &str) -> String {
    if message.starts_with("Error") || message.starts_with("Warning") {
        message.to_string()
    } else {
        format!("Error: {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::user_message;

    #[test]
    fn an_error_is_labelled_once() {
        assert_eq!(user_message("no message given"), "Error: no message given");
        assert_eq!(user_message("Error: No reply target."), "Error: No reply target.");
    }
}
