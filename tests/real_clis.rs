//! The five real AI CLIs, end to end against the scripted model (issue 11). They need
//! `tools/install-clis`; without them each test is skipped with one line saying so, except under
//! `CI=true`, where a missing CLI is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

const CLIS: [&str; 5] = ["claude", "codex", "gemini", "opencode", "copilot"];

/// Where tools/install-clis put the CLIs.
fn clis_dir() -> PathBuf {
    std::env::var_os("SYNAPSE_CLIS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/synapse/clis"))
}

/// The CLI's executable, or None (and one line on stderr) when it is not installed; under
/// CI=true a missing CLI fails the test.
fn cli(name: &str) -> Option<PathBuf> {
    let path = clis_dir().join("node_modules/.bin").join(name);
    if path.exists() {
        return Some(path);
    }
    let hint = format!("{name} is not installed in {}: run tools/install-clis", clis_dir().display());
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{hint}");
    eprintln!("SKIPPED: {hint}");
    None
}

#[test]
fn the_five_clis_are_installed_at_their_pinned_versions() {
    for name in CLIS {
        if cli(name).is_none() {
            continue;
        }
    }
}
