//! Synapse: an event-sourced broker that lets AI coding CLIs work together.
//!
//! Layout, from the top of the program to the bottom. A module imports only modules below it
//! (`tests/layers.rs` reads every file's imports and fails on one that runs up, or on two files
//! importing each other):
//! - `cli`: command-line definitions and one module per command group; runs the daemon.
//! - `daemon`: the broker's start-up and stop: binds the sockets, starts the broker, serves the
//!   HTTP routers, stops everything in order. Composes `broker` and `http`; only `cli` runs it.
//! - [`scripted_model`]: a model server answering by script, for tests with the real CLIs.
//! - `agent`: the wrapper around an agent CLI (PTY, readiness, delivery of tickets).
//! - [`mcp`]: `synapse mcp`, the MCP server over stdio that gives a model Synapse's commands as
//!   tools (send, reply, list_agents, ...), acting as the agent it runs in; built on `rmcp`.
//! - `client`: the typed client of [`api`]: the connection to the broker over its Unix socket
//!   (TCP as a fallback), with autostart; used by the CLI, the wrappers and the benchmarks.
//! - `http`: thin shells over the broker: the broker API and the agents' A2A endpoints, one
//!   error type, authentication and request rules, the agents' own servers.
//! - `broker`: the writer thread (group commit), commands and their pure decisions
//!   (`broker::command`), tails, the background tasks, the outbound HTTP client (webhooks,
//!   external agents). Knows nothing of `http`.
//! - [`store`]: the redb log and its projections; rebuild and verify (synchronous).
//! - [`api`]: the contract on the wire: every request and answer between the CLI, the agent
//!   wrappers, the benchmarks and the broker, as serde types; header names; the version.
//! - [`event`]: event and envelope types and their encoding (no I/O).
//! - `settings`, `trust`, `config`: files in the home, profiles, the broker's security settings
//!   and the deliberate-stop marker, paths.
//! - [`logging`]: the processes' log (`tracing`) on standard error, or in a file.
//! - Base, usable by all and importing nothing above: `private_files` (files and directories
//!   as 0600 / 0700), `escape` (terminal-safe text), [`time`] (now, RFC 3339 both ways),
//!   [`process`] (pid liveness, start times, lineage, signals), [`secret`] (secret hashing, hex,
//!   the one constant-time comparison).

pub mod agent;
pub mod api;
pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod escape;
pub mod event;
pub mod http;
pub mod ids;
pub mod logging;
pub mod mcp;
pub mod private_files;
pub mod process;
pub mod project_trust;
pub mod scripted_model;
pub mod secret;
pub mod settings;
pub mod store;
pub mod time;
pub mod trust;
