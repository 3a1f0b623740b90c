//! `synapse`: parse, run, map errors to exit codes. This and the wrapper's executable
//! (`src/bin/synapse-agent.rs`) are the places an error becomes the user's `Error: ...` line
//! ([`synapse::cli::user_message`]): messages everywhere else say only what went wrong.

use std::process::ExitCode;

fn main() -> ExitCode {
    end_quietly_on_a_closed_pipe();
    let cli = match synapse::cli::parse_args() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() { 2 } else { 0 });
        }
    };
    synapse::logging::init();
    match synapse::cli::run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            eprintln!("{}", synapse::cli::user_message(&format!("{error:#}")));
            ExitCode::from(1)
        }
    }
}

/// `synapse history stats | head -1`: once the reader has gone, printing fails and `println!`
/// panics. Such a command ends quietly instead (no panic message, status 141). Rust ignores
/// SIGPIPE so that sockets report errors instead of killing the process; that stays so, and
/// only this panic is turned into a quiet exit. Printing that fails otherwise (`> /dev/full`)
/// is an error: one line and status 1, not a panic.
fn end_quietly_on_a_closed_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if let Some(cause) = message.strip_prefix("failed printing to stdout") {
            if cause.contains("Broken pipe") {
                std::process::exit(synapse::cli::CLOSED_PIPE_EXIT);
            }
            let cause = cause.trim_start_matches(':').trim();
            eprintln!(
                "{}",
                synapse::cli::user_message(&format!(
                    "cannot write the output: {cause}; what was printed is incomplete"
                ))
            );
            std::process::exit(1);
        }
        // Caught, and reported in the wrapper's log (a screen model that failed).
        if synapse::agent::readiness::panic_is_contained() {
            return;
        }
        default_hook(info);
    }));
}
