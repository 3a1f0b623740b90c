//! What the broker's unit tests share.

use super::BrokerState;
use super::command::{Command, RegisterRequest};
use std::sync::Arc;

/// A broker's state on a temporary home (its writer running, no indexer yet), after one
/// agent registered.
pub async fn broker_with_an_agent() -> (tempfile::TempDir, Arc<BrokerState>) {
    let dir = tempfile::tempdir().unwrap();
    let paths = crate::config::Paths { home: dir.path().join("home"), uds_dir: dir.path().join("uds"), broker_port: 0 };
    std::fs::create_dir_all(&paths.home).unwrap();
    let store = crate::store::Store::open(&paths.database()).unwrap();
    let (state, _writer_thread) = BrokerState::start(store, paths).unwrap();
    let register = Command::RegisterAgent(RegisterRequest {
        agent_type: "dummy".into(),
        name: None,
        role: None,
        pid: std::process::id(),
        working_dir: String::new(),
        port: 40_001,
        secret_hash: crate::secret::hash_secret("secret"),
        pid_start: None,
        wrapper: false,
        by_user: true,
    });
    state.writer.submit(register).await.unwrap();
    (dir, state)
}
