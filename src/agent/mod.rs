//! Agents in PTYs: profiles, the readiness model, the wrapper and its watcher, `@agent` input
//! routing, and the built-in dummy agent.

pub mod dummy;
pub mod hook;
pub mod input;
pub mod mcp_wiring;
pub mod profile;
pub mod readiness;
pub mod scenario;
pub mod terminal;
pub mod wrapper;
