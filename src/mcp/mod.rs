//! `synapse mcp`: an MCP server over stdio (the official Rust SDK, `rmcp`) that gives a model
//! tools instead of text to parse: `send`, `reply`, `list_agents`, `reply_targets`,
//! `history_search`, `task`, and while file safety is on `lock_file` / `unlock_file` /
//! `check_file`. Each maps one to one onto a CLI command, with its rules and its errors.
//!
//! Layout: [`arguments`] validates what the model sends (no I/O); `server` holds the tools and
//! talks to the broker through the typed client.
//!
//! Invariants: stdout carries only the protocol (logs go to stderr, a started broker writes to
//! its own log); the server acts as the agent whose environment it runs in, or anonymously;
//! the set of tools is fixed when the server starts (file safety read once).

pub mod arguments;
mod input;
mod server;

pub use server::{FILE_TOOLS, Identity, SynapseTools};

use crate::config::Paths;
use anyhow::Context;
use rmcp::ServiceExt;

/// Serves MCP on stdin / stdout until the client closes them.
pub async fn serve(paths: Paths) -> anyhow::Result<i32> {
    let file_safety = crate::settings::file_safety_enabled(&paths.home);
    // A working directory removed under the CLI leaves the tools working; only a relative path
    // for the file tools has nothing to be relative to.
    let working_dir = std::env::current_dir()
        .inspect_err(|error| {
            tracing::warn!("cannot read the working directory ({error}): file tools take absolute paths only")
        })
        .ok();
    let tools = SynapseTools::new(paths, Identity::from_env(), file_safety, working_dir);
    let (stdin, stdout) = rmcp::transport::stdio();
    let service =
        tools.serve((input::mended(stdin), stdout)).await.context("the MCP client did not complete the handshake")?;
    service.waiting().await.context("the MCP session ended abnormally")?;
    Ok(0)
}
