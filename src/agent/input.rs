//! `@Agent` from the keyboard (seed 001): a line the user starts with `@<target> ` is sent to
//! that agent instead of being typed into the CLI; anything else passes through untouched.
//!
//! A pure state machine over the bytes the user types, so it is tested without a terminal.

/// What to do with a piece of the user's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// Bytes for the CLI.
    Pass(Vec<u8>),
    /// Bytes to show on the user's terminal only (local echo of a held `@` line).
    Echo(Vec<u8>),
    /// Send `message` to `target`.
    Send { target: String, message: String },
}

#[derive(Default)]
pub struct InputRouter {
    /// The held `@...` line, while one is being typed.
    held: Option<Vec<u8>>,
    /// How many characters the line typed into the CLI holds, as far as the keys tell: Enter,
    /// Ctrl-U and Ctrl-C empty it, Backspace takes one away. None once a key whose effect on the
    /// line is unknown (an arrow, Tab, a paste) was typed, until something empties it again.
    /// An `@` starts an `@agent` line only when the line is known to be empty: decided by what
    /// the line holds, never by how fast the keys came.
    typed: Option<usize>,
    /// Inside a bracketed paste (between `ESC [200~` and `ESC [201~`): its bytes are text, not
    /// keys, so its line breaks start no line and its `@` no `@agent` line.
    pasting: bool,
    /// The last bytes passed to the CLI, to find the paste markers across reads.
    tail: [u8; 6],
    /// How many characters the CLI's input box holds, as far as the keys tell, across the
    /// lines of a draft: Enter sends it (empties the box), but a newline typed into it (Ctrl-J,
    /// Claude's backslash-Enter) does not. None: not known (an arrow, Tab, a paste, and Alt- or
    /// Shift-Enter, which arrive as `ESC` `CR`).
    draft: Option<usize>,
    /// Does the draft hold a newline typed into it? Ctrl-U then empties only its last line.
    draft_lines: bool,
    /// How many times the user sent the CLI a line that may hold text (their own prompt): an
    /// Enter on a draft not known to be empty, or a line begun with `@` that named no agent.
    submitted: u64,
}

impl InputRouter {
    pub fn new() -> InputRouter {
        InputRouter {
            held: None,
            typed: Some(0),
            pasting: false,
            tail: [0; 6],
            draft: Some(0),
            draft_lines: false,
            submitted: 0,
        }
    }

    /// Follows what a key passed to the CLI does to the line it is typed into.
    fn track(&mut self, byte: u8) {
        let before = self.tail[5];
        self.tail.rotate_left(1);
        self.tail[5] = byte;
        if self.pasting {
            // What a paste leaves in the line is not known.
            self.pasting = self.tail != *crate::escape::PASTE_END;
            self.typed = None;
            self.draft = None;
            return;
        }
        let newline = (byte == b'\r' && (before == b'\\' || before == 0x1b)) || byte == b'\n';
        if byte == b'\r' && !newline && self.draft != Some(0) {
            self.submitted += 1;
        }
        self.draft = match byte {
            // Claude's backslash-Enter: the backslash, counted, becomes the newline. Alt- or
            // Shift-Enter: the ESC made the count unknown, and the CR sends nothing.
            b'\r' if before == b'\\' || before == 0x1b => self.draft,
            b'\n' => self.draft.map(|count| count + 1),
            0x15 if self.draft_lines => None,
            b'\r' | 0x15 | 0x03 => Some(0),
            0x7f | 0x08 => self.draft.map(|count| count.saturating_sub(1)),
            0x17 => self.draft.filter(|count| *count == 0),
            0x80..=0xbf => self.draft,
            byte if byte < 0x20 => None,
            _ => self.draft.map(|count| count + 1),
        };
        self.draft_lines = match self.draft {
            Some(0) => false,
            _ => self.draft_lines || newline,
        };
        if self.tail == *crate::escape::PASTE_START {
            self.pasting = true;
        }
        self.typed = match byte {
            b'\r' | b'\n' | 0x15 | 0x03 => Some(0),
            0x7f | 0x08 => self.typed.map(|count| count.saturating_sub(1)),
            // Ctrl-W takes a word away: how much is not known here.
            0x17 => self.typed.filter(|count| *count == 0),
            // The continuation bytes of a UTF-8 character add nothing more.
            0x80..=0xbf => self.typed,
            byte if byte < 0x20 => None,
            _ => self.typed.map(|count| count + 1),
        };
    }

    /// May the CLI's input box hold the user's text, as far as their keys tell (it is not known
    /// to be empty)? A draft of several lines counts whole.
    pub fn line_may_hold_text(&self) -> bool {
        self.draft != Some(0)
    }

    /// How many prompts of their own the user has sent the CLI (lines that may hold text).
    pub fn submitted(&self) -> u64 {
        self.submitted
    }

    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Routed> {
        let mut out = Vec::new();
        let mut pass = Vec::new();
        for &byte in bytes {
            match self.held.as_mut() {
                None => {
                    if self.typed == Some(0) && byte == b'@' {
                        if !pass.is_empty() {
                            out.push(Routed::Pass(std::mem::take(&mut pass)));
                        }
                        self.held = Some(vec![byte]);
                        out.push(Routed::Echo(vec![byte]));
                    } else {
                        pass.push(byte);
                        self.track(byte);
                    }
                }
                Some(line) => match byte {
                    b'\r' | b'\n' => {
                        let line = self.held.take().unwrap_or_default();
                        self.typed = Some(0);
                        out.push(Routed::Echo(b"\r\n".to_vec()));
                        match parse(&line) {
                            Some((target, message)) => out.push(Routed::Send { target, message }),
                            None => {
                                // Not an `@agent` line: the user's own prompt, sent.
                                self.submitted += 1;
                                let mut bytes = line;
                                bytes.push(byte);
                                out.push(Routed::Pass(bytes));
                            }
                        }
                    }
                    0x7f | 0x08 => {
                        // One character, not one byte: its UTF-8 continuation bytes, then its first.
                        while line.pop().is_some_and(|last| (0x80..=0xbf).contains(&last)) {}
                        out.push(Routed::Echo(b"\x08 \x08".to_vec()));
                        if line.is_empty() {
                            self.held = None;
                        }
                    }
                    0x03 | 0x15 => {
                        // Ctrl-C or Ctrl-U: the held line is dropped, the CLI's line is still empty.
                        let dropped = self.held.take().unwrap_or_default();
                        self.typed = Some(0);
                        out.push(Routed::Echo(if byte == 0x03 {
                            b"^C\r\n".to_vec()
                        } else {
                            // Rub out what was echoed, character by character.
                            let characters = dropped.iter().filter(|b| !(0x80..=0xbf).contains(*b)).count();
                            b"\x08 \x08".repeat(characters)
                        }));
                    }
                    byte if byte < 0x20 => {
                        // Anything else (arrows, tab, ...): give the line to the CLI as typed.
                        let bytes = self.held.take().unwrap_or_default();
                        self.typed = Some(0);
                        for &typed in &bytes {
                            self.track(typed);
                        }
                        self.track(byte);
                        let mut bytes = bytes;
                        bytes.push(byte);
                        out.push(Routed::Pass(bytes));
                    }
                    byte => {
                        line.push(byte);
                        out.push(Routed::Echo(vec![byte]));
                    }
                },
            }
        }
        if !pass.is_empty() {
            out.push(Routed::Pass(pass));
        }
        out
    }
}

fn parse(line: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(line).ok()?;
    let rest = text.strip_prefix('@')?;
    let (target, message) = rest.split_once(' ')?;
    let message = message.trim();
    if target.is_empty() || message.is_empty() {
        return None;
    }
    Some((target.to_string(), message.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(routed: &[Routed]) -> Vec<(String, String)> {
        routed
            .iter()
            .filter_map(|r| match r {
                Routed::Send { target, message } => Some((target.clone(), message.clone())),
                _ => None,
            })
            .collect()
    }

    fn passed(routed: &[Routed]) -> Vec<u8> {
        routed.iter().flat_map(|r| if let Routed::Pass(b) = r { b.clone() } else { Vec::new() }).collect()
    }

    /// A prompt of the user's own is a line that may hold text, sent: not an empty Enter, a
    /// newline typed into a draft, a line break inside a paste, Ctrl-C, or an `@agent` line.
    #[test]
    fn only_a_line_that_may_hold_text_counts_as_the_users_prompt() {
        let cases: [(&[u8], u64); 10] = [
            (b"\r", 0),
            (b"fix it\r", 1),
            (b"fix it\x03\r", 0),
            (b"a\nb\r", 1),
            (b"a\\\rb", 0),
            (b"\x1b[200~one\rtwo\x1b[201~", 0),
            (b"\x1b[200~one\rtwo\x1b[201~\r", 1),
            (b"\x1b[A\r", 1),
            (b"@bob hi\r", 0),
            (b"@bob\r", 1),
        ];
        for (keys, prompts) in cases {
            let mut router = InputRouter::new();
            router.feed(keys);
            assert_eq!(router.submitted(), prompts, "{:?}", String::from_utf8_lossy(keys));
        }
        let mut router = InputRouter::new();
        router.feed(b"one\r");
        router.feed(b"\r");
        router.feed(b"two\r");
        assert_eq!(router.submitted(), 2);
    }

    #[test]
    fn an_at_line_is_sent_to_the_agent_and_not_typed_into_the_cli() {
        let mut router = InputRouter::new();
        let routed = router.feed(b"@codex review main.rs please\r");
        assert_eq!(sends(&routed), vec![("codex".to_string(), "review main.rs please".to_string())]);
        assert!(passed(&routed).is_empty());
    }

    #[test]
    fn ordinary_input_and_at_signs_inside_a_line_pass_through_untouched() {
        let mut router = InputRouter::new();
        let routed = router.feed(b"email me@example.com\r");
        assert_eq!(passed(&routed), b"email me@example.com\r");
        let routed = router.feed(b"\x1b[A");
        assert_eq!(passed(&routed), b"\x1b[A");
    }

    #[test]
    fn typing_can_be_split_across_reads_and_corrected_with_backspace() {
        let mut router = InputRouter::new();
        let mut all = Vec::new();
        for chunk in [&b"@gem"[..], b"x\x7fini hel", b"lo\r"] {
            all.extend(router.feed(chunk));
        }
        assert_eq!(sends(&all), vec![("gemini".to_string(), "hello".to_string())]);
    }

    #[test]
    fn backspace_takes_back_a_whole_character() {
        let mut router = InputRouter::new();
        let routed = router.feed(
            "@bob héllo
"
            .as_bytes(),
        );
        assert_eq!(sends(&routed), vec![("bob".to_string(), "hllo".to_string())]);
        let routed = router.feed(
            "@bob 中ok
"
            .as_bytes(),
        );
        assert_eq!(sends(&routed), vec![("bob".to_string(), "ok".to_string())]);
    }

    /// Issue 14: after Ctrl-U an `@bob` line went to the CLI (only Enter counted as a line start).
    #[test]
    fn an_at_line_starts_wherever_the_typed_line_is_empty_whatever_emptied_it() {
        for emptied_by in [&b"abc\x15"[..], b"abc\x03", b"ab\x7f\x7f", b"\xc3\xa9\x7f", b"x\r"] {
            let mut router = InputRouter::new();
            let mut routed = router.feed(emptied_by);
            routed.extend(router.feed(b"@bob hi\r"));
            assert_eq!(sends(&routed), vec![("bob".to_string(), "hi".to_string())], "after {emptied_by:?}");
        }
    }

    #[test]
    fn an_at_sign_after_text_or_a_cursor_move_is_part_of_the_cli_line() {
        for typed in [&b"a@bob hi\r"[..], b"ab\x7f@bob hi\r", b"\x1b[D@bob hi\r", b"x\t@bob hi\r"] {
            let mut router = InputRouter::new();
            let routed = router.feed(typed);
            assert!(sends(&routed).is_empty(), "{typed:?}");
            assert_eq!(passed(&routed), typed.to_vec(), "{typed:?}");
        }
    }

    /// A pasted block's lines are text: one that starts with `@` (a Python decorator, a chat
    /// log) went to that agent and was cut out of the paste.
    #[test]
    fn lines_of_a_paste_are_never_at_lines() {
        let paste = b"\x1b[200~x\r@pytest.mark.slow\r@bob deploy prod\r\x1b[201~";
        let mut router = InputRouter::new();
        let routed = router.feed(paste);
        assert!(sends(&routed).is_empty(), "{routed:?}");
        assert_eq!(passed(&routed), paste.to_vec());
        // Split across reads, markers included; a paste that starts on an empty line.
        let mut router = InputRouter::new();
        let mut routed = Vec::new();
        for chunk in [&b"\x1b[20"[..], b"0~@bob hi\r@bob", b" again\r\x1b[2", b"01~"] {
            routed.extend(router.feed(chunk));
        }
        assert!(sends(&routed).is_empty(), "{routed:?}");
        // After the paste the line holds its text: Enter sends it, then an `@` line works again.
        routed = router.feed(b"@bob x\r");
        assert!(sends(&routed).is_empty(), "{routed:?}");
        routed = router.feed(b"@bob after\r");
        assert_eq!(sends(&routed), vec![("bob".to_string(), "after".to_string())]);
    }

    #[test]
    fn the_router_knows_when_the_typed_line_may_hold_text() {
        let mut router = InputRouter::new();
        assert!(!router.line_may_hold_text());
        router.feed(b"draft");
        assert!(router.line_may_hold_text());
        router.feed(b"\x7f\x7f\x7f\x7f\x7f");
        assert!(!router.line_may_hold_text());
        router.feed(b"more\r");
        assert!(!router.line_may_hold_text());
        router.feed(b"\x1b[A");
        assert!(router.line_may_hold_text(), "a recalled line is not known to be empty");
        router.feed(b"\x15");
        assert!(!router.line_may_hold_text());
        router.feed(b"@bob held");
        assert!(!router.line_may_hold_text(), "a held @ line is not in the CLI");
        // A newline typed into a draft does not send it: Ctrl-J, Alt- or Shift-Enter (ESC CR),
        // Claude's backslash-Enter. Enter does.
        for newline in [&b"\n"[..], b"\x1b\r", b"\\\r"] {
            let mut router = InputRouter::new();
            router.feed(b"first line");
            router.feed(newline);
            assert!(router.line_may_hold_text(), "after {newline:?}");
            router.feed(b"second\r");
            assert!(!router.line_may_hold_text(), "sent, after {newline:?}");
        }
        let mut router = InputRouter::new();
        router.feed(b"ab\nc\x7f");
        assert!(router.line_may_hold_text(), "the first line is still there");
        router.feed(b"\x7f\x7f\x7f");
        assert!(!router.line_may_hold_text());
        // Ctrl-U empties the line it is typed on: in a draft of several, the others stay.
        let mut router = InputRouter::new();
        router.feed(b"first line\noops\x15");
        assert!(router.line_may_hold_text(), "the first line is still there");
        router.feed(b"\r");
        router.feed(b"one line\x15");
        assert!(!router.line_may_hold_text());
        // Backslash-Enter: the backslash turned newline, then both lines rubbed out.
        let mut router = InputRouter::new();
        router.feed(b"ab\\\rc");
        router.feed(&[0x7f; 4]);
        assert!(!router.line_may_hold_text());
    }

    #[test]
    fn ctrl_u_drops_a_held_at_line_and_rubs_out_its_echo() {
        let mut router = InputRouter::new();
        let mut routed = router.feed(b"@bo\x15");
        assert!(passed(&routed).is_empty() && sends(&routed).is_empty());
        assert!(routed.contains(&Routed::Echo(b"\x08 \x08\x08 \x08\x08 \x08".to_vec())), "{routed:?}");
        routed = router.feed(b"@bob again\r");
        assert_eq!(sends(&routed), vec![("bob".to_string(), "again".to_string())]);
    }

    #[test]
    fn an_at_line_without_a_message_goes_to_the_cli_and_ctrl_c_drops_it() {
        let mut router = InputRouter::new();
        assert_eq!(passed(&router.feed(b"@alone\r")), b"@alone\r");
        let routed = router.feed(b"@codex half\x03");
        assert!(sends(&routed).is_empty() && passed(&routed).is_empty());
        // After the dropped line, a normal line passes again.
        assert_eq!(passed(&router.feed(b"ls\r")), b"ls\r");
    }
}
