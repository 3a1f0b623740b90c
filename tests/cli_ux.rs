//! What a user sees at the command line (issue 14): closed pipes, typos, one JSON document.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Stdio;

/// `synapse history stats | head -1` panicked ("failed printing to stdout: Broken pipe", status
/// 101). A closed pipe now ends the command quietly.
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    assert!(home.run_as(&alice, &["send", "bob", "hello", "--no-response"]).status.success());
    for args in [&["history", "stats"][..], &["history", "list"], &["list"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = home.cmd(args).stdout(writer).stderr(Stdio::piped()).output().unwrap();
        let errors = stderr(&output);
        assert!(!errors.contains("panicked") && !errors.contains("Broken pipe"), "{args:?}: {errors}");
        assert_ne!(output.status.code(), Some(101), "{args:?}: {errors}");
    }
}

/// `synapse lsit` said only "unknown profile 'lsit'".
#[test]
fn a_mistyped_command_suggests_the_one_meant() {
    let home = Home::new();
    let output = home.run(&["lsit"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(stderr(&output).contains("Did you mean `synapse list`?"), "{}", describe(&output));
    let unknown = home.run(&["qqqqqq"]);
    assert!(!stderr(&unknown).contains("Did you mean"), "{}", describe(&unknown));
}
