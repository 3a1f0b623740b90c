//! Settings files, `synapse init` / `synapse reset`, and `a2a.flow` (issue 6, item 5).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;
use std::process::Stdio;

fn in_project(home: &Home, project: &std::path::Path, args: &[&str]) -> std::process::Output {
    home.cmd(args).current_dir(project).output().unwrap()
}

#[test]
fn init_writes_a_template_once_and_reset_removes_it_only_when_confirmed() {
    let home = Home::new();
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let output = in_project(&home, &project, &["init"]);
    assert!(output.status.success(), "{}", describe(&output));
    let file = project.join(".synapse/settings.json");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written["a2a"]["flow"], "auto");
    let again = in_project(&home, &project, &["init"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("already exists"), "{}", describe(&again));
    assert!(in_project(&home, &project, &["init", "--force"]).status.success());
    let user = in_project(&home, &project, &["init", "--scope", "user"]);
    assert!(user.status.success());
    assert!(home.home().join("settings.json").exists());

    let refused = in_project(&home, &project, &["reset"]);
    assert_eq!(refused.status.code(), Some(1), "stdin is not a terminal: {}", describe(&refused));
    assert!(file.exists());
    assert!(in_project(&home, &project, &["reset", "-f"]).status.success());
    assert!(!file.exists());
    assert_eq!(in_project(&home, &project, &["init", "--scope", "elsewhere"]).status.code(), Some(2));
}

/// A cloned project may hold links where its settings go: `init` never writes through them.
#[test]
fn init_never_writes_through_a_link_in_the_project() {
    let home = Home::new();
    let outside = home.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("dotfile"), "export IMPORTANT=1\n").unwrap();
    let project = home.dir.path().join("clone");
    std::fs::create_dir_all(project.join(".synapse")).unwrap();
    std::os::unix::fs::symlink(outside.join("dotfile"), project.join(".synapse/settings.local.json")).unwrap();
    std::os::unix::fs::symlink(outside.join("new"), project.join(".synapse/settings.json")).unwrap();

    let dangling = in_project(&home, &project, &["init"]);
    assert_eq!(dangling.status.code(), Some(1), "{}", describe(&dangling));
    assert!(stderr(&dangling).contains("already exists"), "{}", describe(&dangling));
    assert!(!outside.join("new").exists(), "nothing made at the link's target");
    let local = in_project(&home, &project, &["init", "--scope", "local"]);
    assert_eq!(local.status.code(), Some(1), "{}", describe(&local));

    let forced = in_project(&home, &project, &["init", "--scope", "local", "--force"]);
    assert!(forced.status.success(), "{}", describe(&forced));
    assert!(stdout(&forced).contains("the link is replaced by this file"), "{}", describe(&forced));
    assert_eq!(std::fs::read_to_string(outside.join("dotfile")).unwrap(), "export IMPORTANT=1\n");
    let replaced = project.join(".synapse/settings.local.json");
    assert!(replaced.symlink_metadata().unwrap().file_type().is_file(), "the link itself is replaced");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&replaced).unwrap()).unwrap();
    assert_eq!(written["a2a"]["flow"], "auto");
    assert_eq!(std::fs::read_dir(project.join(".synapse")).unwrap().count(), 2, "no temporary file left");

    // The settings directory itself a link: nothing is written in its target.
    let linked = home.dir.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&outside, linked.join(".synapse")).unwrap();
    let refused = in_project(&home, &linked, &["init", "--force"]);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("is a symbolic link"), "{}", describe(&refused));
    assert!(!outside.join("settings.json").exists());
}

#[test]
fn a2a_flow_sets_the_default_of_send_and_flags_override_it() {
    let home = Home::new();
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(project.join(".synapse")).unwrap();
    let bob = home.register(Some("bob"));
    std::fs::write(project.join(".synapse/settings.json"), r#"{"a2a":{"flow":"oneway"}}"#).unwrap();
    let oneway: Value =
        serde_json::from_slice(&in_project(&home, &project, &["send", "bob", "fyi", "--json"]).stdout).unwrap();
    assert!(oneway["sender_task"].is_null(), "oneway sends expect no reply: {oneway}");
    let asked: Value =
        serde_json::from_slice(&in_project(&home, &project, &["send", "bob", "q", "--response", "--json"]).stdout)
            .unwrap();
    assert!(asked["sender_task"]["id"].is_string());

    // The local file overrides the project file: roundtrip waits for the reply.
    std::fs::write(project.join(".synapse/settings.local.json"), r#"{"a2a":{"flow":"roundtrip"}}"#).unwrap();
    let waiter = home
        .cmd(&["send", "bob", "what now?"])
        .current_dir(&project)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        let inbox: Value = serde_json::from_str(&home.ok(&["agent", "inbox", &bob.id, "--wait-ms", "10000"])).unwrap();
        if inbox["tickets"].as_array().unwrap().iter().any(|ticket| ticket["text"] == "what now?") {
            break;
        }
    }
    let targets = stdout(&home.run_as(&bob, &["reply", "--list-targets"]));
    let anonymous =
        targets.lines().find(|line| line.contains("what now?")).unwrap().split_whitespace().next().unwrap().to_string();
    let replied = home.run_as(&bob, &["reply", "--to", &anonymous, "carry on"]);
    assert!(replied.status.success(), "{}", describe(&replied));
    let output = waiter.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stdout(&output).lines().any(|line| line == "carry on"), "{}", describe(&output));
}

#[test]
fn a_malformed_settings_file_is_an_error_naming_the_file_and_line() {
    let home = Home::new();
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(project.join(".synapse")).unwrap();
    home.register(Some("bob"));
    std::fs::write(project.join(".synapse/settings.json"), "{\n  \"a2a\": {\"flow\": \"auto\",}\n}").unwrap();
    let output = in_project(&home, &project, &["send", "bob", "hi"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("settings.json line 2"), "{}", describe(&output));
    std::fs::write(project.join(".synapse/settings.json"), r#"{"a2a":{"flow":"sometimes"}}"#).unwrap();
    let output = in_project(&home, &project, &["send", "bob", "hi"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("a2a.flow 'sometimes'"), "{}", describe(&output));
}

/// `synapse trust`: what it shows of a hostile file, and its bad input. (That an untrusted
/// project's env keeps an agent from starting: `agents::a_cli_config_named_in_the_settings_env_*`.)
#[test]
fn trust_shows_the_variables_escaped_and_refuses_what_is_no_project() {
    let home = Home::new();
    let project = home.dir.path().join("project");
    std::fs::create_dir_all(project.join(".synapse")).unwrap();
    // The template written by `init` sets no variable: nothing to trust.
    assert!(in_project(&home, &project, &["init"]).status.success());
    let nothing = in_project(&home, &project, &["trust"]);
    assert!(nothing.status.success(), "{}", describe(&nothing));
    assert!(stdout(&nothing).contains("sets no env for agents: nothing to trust"), "{}", describe(&nothing));
    assert!(!home.home().join("trusted-projects.json").exists());

    std::fs::write(
        project.join(".synapse/settings.json"),
        r#"{"env": {"NODE_OPTIONS": "--require /tmp/x.js\u001b]0;owned\u0007"}}"#,
    )
    .unwrap();
    let trusted = home.run(&["trust", project.to_str().unwrap()]);
    assert!(trusted.status.success(), "{}", describe(&trusted));
    assert!(!stdout(&trusted).contains('\u{1b}'), "a control character reached the terminal: {}", describe(&trusted));
    assert!(stdout(&trusted).contains("NODE_OPTIONS=--require /tmp/x.js"), "{}", describe(&trusted));
    let revoked = in_project(&home, &project, &["trust", "--revoke"]);
    assert!(stdout(&revoked).contains("No longer trusted"), "{}", describe(&revoked));
    let again = in_project(&home, &project, &["trust", "--revoke"]);
    assert!(again.status.success() && stdout(&again).contains("was not trusted"), "{}", describe(&again));

    let missing = home.run(&["trust", home.dir.path().join("nowhere").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(1), "{}", describe(&missing));
    assert!(stderr(&missing).contains("is not a directory"), "{}", describe(&missing));

    // A directory whose name would hide what is shown (a dimming escape, a right-to-left
    // override) is shown escaped; a trusted one removed since can still be taken back by its
    // path, so that a new checkout there is not trusted; --list says what is.
    let odd = home.dir.path().join("odd\u{1b}[8m\u{202e}dir");
    std::fs::create_dir_all(odd.join(".synapse")).unwrap();
    std::fs::write(odd.join(".synapse/settings.json"), r#"{"env": {"LD_PRELOAD": "/tmp/x.so"}}"#).unwrap();
    let trusted = home.run(&["trust", odd.to_str().unwrap()]);
    assert!(trusted.status.success(), "{}", describe(&trusted));
    assert!(!stdout(&trusted).contains(['\u{1b}', '\u{202e}']), "{}", describe(&trusted));
    assert!(stdout(&trusted).contains("odd^[[8m\\u{202e}dir"), "{}", describe(&trusted));
    let listed = home.ok(&["trust", "--list"]);
    assert!(listed.contains("odd^[[8m\\u{202e}dir") && !listed.contains('\u{1b}'), "{listed}");
    std::fs::remove_dir_all(&odd).unwrap();
    let revoked = home.run(&["trust", "--revoke", odd.to_str().unwrap()]);
    assert!(revoked.status.success() && stdout(&revoked).contains("No longer trusted"), "{}", describe(&revoked));
    assert_eq!(home.ok(&["trust", "--list"]).trim(), "No project's env is trusted.");
    // Also by a path through a link, or with `..`, once the directory is gone.
    let real = home.dir.path().join("real");
    std::fs::create_dir_all(real.join("p2/.synapse")).unwrap();
    std::fs::write(real.join("p2/.synapse/settings.json"), r#"{"env": {"B": "2"}}"#).unwrap();
    std::os::unix::fs::symlink(&real, home.dir.path().join("ln")).unwrap();
    let through_link = home.dir.path().join("ln/p2");
    assert!(home.run(&["trust", through_link.to_str().unwrap()]).status.success());
    std::fs::remove_dir_all(real.join("p2")).unwrap();
    let revoked = home.cmd(&["trust", "--revoke", "../ln/p2"]).current_dir(&project).output().unwrap();
    assert!(stdout(&revoked).contains("No longer trusted"), "{}", describe(&revoked));
    assert_eq!(home.ok(&["trust", "--list"]).trim(), "No project's env is trusted.");
    // A damaged list is said first: nothing is shown as if it were about to be trusted.
    std::fs::write(home.home().join("trusted-projects.json"), "{").unwrap();
    std::fs::write(project.join(".synapse/settings.json"), r#"{"env": {"A": "1"}}"#).unwrap();
    let damaged = in_project(&home, &project, &["trust"]);
    assert_eq!(damaged.status.code(), Some(1), "{}", describe(&damaged));
    assert!(
        stdout(&damaged).is_empty() && stderr(&damaged).contains("trusted-projects.json"),
        "{}",
        describe(&damaged)
    );
    std::fs::remove_file(home.home().join("trusted-projects.json")).unwrap();
    std::fs::write(project.join(".synapse/settings.json"), r#"{"env": {"A": {"nested": 1}}}"#).unwrap();
    let malformed = in_project(&home, &project, &["trust"]);
    assert_eq!(malformed.status.code(), Some(1), "{}", describe(&malformed));
    assert!(stderr(&malformed).contains("env.A"), "{}", describe(&malformed));
}
