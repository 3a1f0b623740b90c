//! Synapse: an event-sourced broker that lets AI coding CLIs work together.
//!
//! Layout:
//! - [`api`]: the contract on the wire: every request and answer between the CLI, the agent
//!   wrappers, the benchmarks and the broker, as serde types; header names; the version.
//! - [`event`]: event and envelope types and their encoding (no I/O).
//! - [`store`]: the redb log and its projections; rebuild and verify (synchronous).
//! - `broker`: the daemon: writer thread (group commit), commands, tails, HTTP servers.
//! - `client`: the typed client of [`api`]: the connection to the broker over its Unix socket
//!   (TCP as a fallback), with autostart; used by the CLI, the wrappers and the benchmarks.
//! - `cli`: command-line definitions and one module per command group.
//! - [`mcp`]: `synapse mcp`, the MCP server over stdio that gives a model Synapse's commands as
//!   tools (send, reply, list_agents, ...), acting as the agent it runs in; built on `rmcp`.
//! - [`scripted_model`]: a model server answering by script, for tests with the real CLIs.
//! - `private_files`: creating files and directories in the home as 0600 / 0700.
//! - `trust`: the broker's security settings file in `SYNAPSE_HOME` and the deliberate-stop marker.

pub mod agent;
pub mod api;
pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod escape;
pub mod event;
pub mod http;
pub mod mcp;
pub mod private_files;
pub mod scripted_model;
pub mod settings;
pub mod store;
pub mod trust;
