//! Synapse: an event-sourced broker that lets AI coding CLIs work together.
//!
//! Layout:
//! - [`event`]: event and envelope types and their encoding (no I/O).
//! - [`store`]: the redb log and its projections; rebuild and verify (synchronous).
//! - `broker`: the daemon: writer thread (group commit), commands, tails, HTTP servers.
//! - `client`: the CLI's connection to the broker over its Unix socket, with autostart.
//! - `cli`: command-line definitions and one module per command group.
//! - [`scripted_model`]: a model server answering by script, for tests with the real CLIs.
//! - `private_files`: creating files and directories in the home as 0600 / 0700.
//! - `trust`: the broker's security settings file in `SYNAPSE_HOME` and the deliberate-stop marker.

pub mod agent;
pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod escape;
pub mod event;
pub mod http;
pub mod private_files;
pub mod process;
pub mod scripted_model;
pub mod secret;
pub mod settings;
pub mod store;
pub mod time;
pub mod trust;
