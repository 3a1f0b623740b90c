//! The user's terminal, when the wrapper runs in one: their keystrokes (`@agent message` lines
//! to the broker, everything else to the CLI, decided by [`InputRouter`]) and its size.
//!
//! Invariant: while a message is being typed into the CLI (from its paste until the CLI has taken
//! it, its submit key sent again if need be) the user's keystrokes are held back and passed on
//! afterwards, in order ([`HeldKeys`]): they can never land inside a message and be sent with it.

use super::Shared;
use super::connection::connect;
use super::pty::PtyInput;
use crate::agent::input::{InputRouter, Routed};
use crate::agent::terminal;
use crate::api;
use portable_pty::PtySize;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

/// The user's keystrokes held back while a message is typed (from its paste until the CLI
/// took it), then passed on: they can never land inside a message and be sent with it.
#[derive(Default)]
pub(super) struct HeldKeys {
    held: Mutex<Option<Vec<u8>>>,
    /// When the user's last keystroke was passed to the CLI: the screen shows it only once the
    /// CLI has redrawn, so a message is not typed right after one (it would join the input).
    last_passed: Mutex<Option<std::time::Instant>>,
    /// May the line the user typed into the CLI hold text (their keys since they last emptied
    /// it, [`InputRouter::line_may_hold_text`])?
    draft: std::sync::atomic::AtomicBool,
    /// The READY spell ([`crate::agent::readiness::Readiness::ready_spells`]) in which the user
    /// last sent the CLI a prompt of their own, straight (not held behind a message being
    /// written); 0 for none.
    prompt_spell: std::sync::atomic::AtomicU64,
}

impl HeldKeys {
    /// Starts holding the user's keystrokes back, or stops and passes on what was held.
    pub fn hold(&self, hold: bool, input: &PtyInput) {
        let Ok(mut held) = self.held.lock() else { return };
        if hold {
            held.get_or_insert_with(Vec::new);
        } else if let Some(bytes) = held.take().filter(|bytes| !bytes.is_empty()) {
            self.pass(bytes, input);
        }
    }

    /// Starts holding the user's keystrokes back, unless one reached the CLI within `window`
    /// (it may not be drawn yet: a message typed now would join it). One step, so that a key
    /// cannot reach the CLI between the look and the hold, right in front of the message.
    pub fn hold_unless_typed(&self, window: std::time::Duration) -> bool {
        let Ok(mut held) = self.held.lock() else { return false };
        if held.is_none() && self.typed_within(window) {
            return false;
        }
        held.get_or_insert_with(Vec::new);
        true
    }

    /// The user's keystrokes: to the CLI now (true), or held while a message is being typed.
    pub fn user_keys(&self, bytes: Vec<u8>, input: &PtyInput) -> bool {
        match self.held.lock() {
            Ok(mut held) if held.is_some() => {
                held.get_or_insert_with(Vec::new).extend_from_slice(&bytes);
                false
            }
            _ => {
                self.pass(bytes, input);
                true
            }
        }
    }

    /// The user's keystrokes to the CLI, and when.
    fn pass(&self, bytes: Vec<u8>, input: &PtyInput) {
        if let Ok(mut last) = self.last_passed.lock() {
            *last = Some(std::time::Instant::now());
        }
        input.send(bytes);
    }

    /// May the user's own line in the CLI hold text, as their keys tell?
    pub fn draft(&self) -> bool {
        self.draft.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The READY spell in which the user last sent the CLI a prompt of their own (0: none).
    pub fn prompt_spell(&self) -> u64 {
        self.prompt_spell.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Did the user's keystrokes reach the CLI within `window`?
    pub fn typed_within(&self, window: std::time::Duration) -> bool {
        self.last_passed.lock().ok().and_then(|last| *last).is_some_and(|last| last.elapsed() < window)
    }
}

/// The user's keystrokes: `@agent message` lines go to the broker, the rest to the CLI.
pub(super) fn spawn_keyboard(shared: Arc<Shared>) {
    let (sends, mut to_send) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let keyboard_shared = shared.clone();
    let _ = std::thread::Builder::new().name("keyboard".into()).spawn(move || {
        let mut router = InputRouter::new();
        let mut stdin = std::io::stdin();
        let mut buffer = [0u8; 4096];
        loop {
            let count = match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(count) => count,
            };
            let prompts = router.submitted();
            let routed = router.feed(&buffer[..count]);
            keyboard_shared.held_keys.draft.store(router.line_may_hold_text(), std::sync::atomic::Ordering::SeqCst);
            let mut passed = true;
            for routed in routed {
                match routed {
                    Routed::Pass(bytes) => passed &= keyboard_shared.held_keys.user_keys(bytes, &keyboard_shared.input),
                    Routed::Echo(bytes) => {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(&bytes).and_then(|_| out.flush());
                    }
                    Routed::Send { target, message } => {
                        let _ = sends.send((target, message));
                    }
                }
            }
            // A prompt of the user's own, sent straight to the CLI (one held behind a message
            // being written reaches it after that message): which READY spell it came in says
            // whether the CLI went back to its prompt between a message and it.
            if router.submitted() != prompts && passed {
                let spell = keyboard_shared.screen.lock().ready_spells(std::time::Instant::now());
                keyboard_shared.held_keys.prompt_spell.store(spell, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    tokio::spawn(async move {
        let mut client = connect(&shared.paths, &shared.secret).await;
        while let Some((target, message)) = to_send.recv().await {
            let request = api::SendRequest {
                from: Some(shared.agent_id.clone()),
                secret: Some(shared.secret.clone()),
                response_expected: true,
                ..api::SendRequest::new(target.clone(), message)
            };
            let line = match client.send(&request).await {
                Ok(answer) => format!(
                    "[synapse] sent to {}: task {}",
                    answer.task.metadata.owner.as_deref().unwrap_or(&target),
                    crate::event::short_id(answer.sender_task.as_ref().map_or("", |task| task.id.as_str()))
                ),
                Err(error) => format!("[synapse] not sent: {error:#}"),
            };
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{line}\r\n");
            let _ = out.flush();
        }
    });
}

/// Follows the user's terminal size.
pub(super) fn spawn_resize(shared: Arc<Shared>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut winch) = signal(SignalKind::window_change()) else { return };
        while winch.recv().await.is_some() {
            if let Some((rows, cols)) = terminal::size(0) {
                if let Ok(master) = shared.master.lock() {
                    let _ = master.resize(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 });
                }
                shared.screen.lock().resize(rows, cols);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_typed_while_held_reach_the_cli_after_the_message_and_in_order() {
        let (mut cli_side, wrapper_side) = std::io::pipe().unwrap();
        let input = super::super::pty::spawn_writer(Box::new(wrapper_side)).unwrap();
        let keys = HeldKeys::default();
        keys.user_keys(b"a".to_vec(), &input);
        keys.hold(true, &input);
        keys.user_keys(b"b".to_vec(), &input);
        input.write(b"[message]".to_vec()).await.unwrap();
        keys.user_keys(b"c".to_vec(), &input);
        keys.hold(false, &input);
        keys.user_keys(b"d".to_vec(), &input);
        drop(input);
        let mut received = String::new();
        cli_side.read_to_string(&mut received).unwrap();
        assert_eq!(received, "a[message]bcd");
    }

    #[tokio::test]
    async fn a_hold_is_refused_right_after_a_keystroke_and_holds_the_next_ones() {
        let (mut cli_side, wrapper_side) = std::io::pipe().unwrap();
        let input = super::super::pty::spawn_writer(Box::new(wrapper_side)).unwrap();
        let keys = HeldKeys::default();
        let window = std::time::Duration::from_secs(60);
        assert!(keys.hold_unless_typed(window), "nothing typed yet");
        keys.user_keys(b"b".to_vec(), &input);
        input.write(b"[message]".to_vec()).await.unwrap();
        keys.hold(false, &input);
        assert!(!keys.hold_unless_typed(window), "a key just reached the CLI");
        keys.user_keys(b"c".to_vec(), &input);
        assert!(keys.hold_unless_typed(std::time::Duration::ZERO));
        keys.user_keys(b"d".to_vec(), &input);
        assert!(keys.hold_unless_typed(window), "already holding: the keys since are held, not passed");
        input.write(b"[second]".to_vec()).await.unwrap();
        keys.hold(false, &input);
        drop(input);
        let mut received = String::new();
        cli_side.read_to_string(&mut received).unwrap();
        assert_eq!(received, "[message]bc[second]d");
    }

    #[tokio::test]
    async fn a_keystroke_passed_on_counts_as_typing_for_a_while_and_a_held_one_does_not() {
        let (_cli_side, wrapper_side) = std::io::pipe().unwrap();
        let input = super::super::pty::spawn_writer(Box::new(wrapper_side)).unwrap();
        let keys = HeldKeys::default();
        let window = std::time::Duration::from_secs(60);
        assert!(!keys.typed_within(window));
        keys.hold(true, &input);
        keys.user_keys(b"held".to_vec(), &input);
        assert!(!keys.typed_within(window), "a held key reached nothing yet");
        keys.hold(false, &input);
        assert!(keys.typed_within(window), "held keys passed on when the hold ends");
        assert!(!keys.typed_within(std::time::Duration::ZERO));
        let keys = HeldKeys::default();
        keys.hold(true, &input);
        keys.hold(false, &input);
        assert!(!keys.typed_within(window), "nothing was held");
        keys.user_keys(b"x".to_vec(), &input);
        assert!(keys.typed_within(window));
    }
}
