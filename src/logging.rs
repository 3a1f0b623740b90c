//! The log of every `synapse` process (`tracing`): on standard error, filtered by `SYNAPSE_LOG`;
//! an interactive wrapper moves it into a file once its CLI has the user's terminal.

/// Sets the log up on standard error, filtered by `SYNAPSE_LOG` (default `warn,synapse=info`).
pub fn init() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("SYNAPSE_LOG").unwrap_or_else(|_| "warn,synapse=info".into());
    // Colour only on a terminal, never with NO_COLOR: the broker's and background wrappers'
    // standard error is a log file, which must hold no escape codes.
    let to_stderr = log_output(tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr), colour_allowed());
    let (output, handle) = tracing_subscriber::reload::Layer::new(to_stderr);
    let _ = LOG_OUTPUT.set(handle);
    tracing_subscriber::registry().with(output).with(filter).init();
}

/// The formatting layer, on standard error or a file.
type LogOutput = tracing_subscriber::fmt::Layer<
    tracing_subscriber::Registry,
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    tracing_subscriber::fmt::writer::BoxMakeWriter,
>;

/// Where [`init`]'s lines go, for [`to_file`] to change.
static LOG_OUTPUT: std::sync::OnceLock<tracing_subscriber::reload::Handle<LogOutput, tracing_subscriber::Registry>> =
    std::sync::OnceLock::new();

fn log_output(writer: tracing_subscriber::fmt::writer::BoxMakeWriter, ansi: bool) -> LogOutput {
    tracing_subscriber::fmt::layer().with_writer(writer).with_target(false).with_ansi(ansi)
}

/// From now on the log goes to the end of `path` (made private if new), without colour: the
/// interactive wrapper's lines would otherwise be drawn over the CLI's screen in the user's
/// terminal. Does nothing in a process whose logging [`init`] did not set up.
pub fn to_file(path: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let Some(handle) = LOG_OUTPUT.get() else { return Ok(()) };
    if let Some(dir) = path.parent() {
        crate::private_files::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let file = crate::private_files::open_append(path).with_context(|| format!("cannot open {}", path.display()))?;
    let writer = tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::sync::Arc::new(file));
    handle.modify(|output| *output = log_output(writer, false)).context("cannot move the log")
}

/// Colour for diagnostics: standard error is a terminal and `NO_COLOR` is unset or empty.
fn colour_allowed() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}
