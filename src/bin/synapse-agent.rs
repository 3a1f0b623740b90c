//! `synapse-agent`: the agent wrapper alone. `synapse <profile> ...` checks its arguments and
//! then runs this executable in its own place (exec: the same pid and terminal), so a wrapper,
//! which lives as long as its agent, maps a program without the broker, the store, the HTTP
//! server and the MCP server (see [`synapse::config::WRAPPER_BIN`]). Its arguments are those
//! after `synapse`: `synapse-agent <profile> [--port N] [--name NAME] ... [-- tool args]`, and
//! `synapse` names itself and its build in the environment; a `synapse-agent` of another build
//! hands back to that `synapse` ([`synapse::cli::check_wrapper_build`]).

use std::process::ExitCode;

fn main() -> ExitCode {
    synapse::logging::init();
    // A panic the wrapper catches (a screen model that failed) is reported in its log only.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !synapse::agent::readiness::panic_is_contained() {
            default_hook(info);
        }
    }));
    let words: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let result = synapse::cli::check_wrapper_build()
        .and_then(|()| synapse::config::Paths::from_env())
        .and_then(|paths| synapse::cli::run_wrapper(paths, words));
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            eprintln!("{}", synapse::cli::user_message(&format!("{error:#}")));
            ExitCode::from(1)
        }
    }
}
