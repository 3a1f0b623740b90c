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
    at_line_start: bool,
}

impl InputRouter {
    pub fn new() -> InputRouter {
        InputRouter { held: None, at_line_start: true }
    }

    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Routed> {
        let mut out = Vec::new();
        let mut pass = Vec::new();
        for &byte in bytes {
            match self.held.as_mut() {
                None => {
                    if self.at_line_start && byte == b'@' {
                        if !pass.is_empty() {
                            out.push(Routed::Pass(std::mem::take(&mut pass)));
                        }
                        self.held = Some(vec![byte]);
                        out.push(Routed::Echo(vec![byte]));
                    } else {
                        pass.push(byte);
                        self.at_line_start = byte == b'\r' || byte == b'\n';
                    }
                }
                Some(line) => match byte {
                    b'\r' | b'\n' => {
                        let line = self.held.take().unwrap_or_default();
                        self.at_line_start = true;
                        out.push(Routed::Echo(b"\r\n".to_vec()));
                        match parse(&line) {
                            Some((target, message)) => out.push(Routed::Send { target, message }),
                            None => {
                                let mut bytes = line;
                                bytes.push(byte);
                                out.push(Routed::Pass(bytes));
                            }
                        }
                    }
                    0x7f | 0x08 => {
                        line.pop();
                        out.push(Routed::Echo(b"\x08 \x08".to_vec()));
                        if line.is_empty() {
                            self.held = None;
                        }
                    }
                    0x03 => {
                        self.held = None;
                        self.at_line_start = true;
                        out.push(Routed::Echo(b"^C\r\n".to_vec()));
                    }
                    byte if byte < 0x20 => {
                        // Anything else (arrows, tab, ...): give the line to the CLI as typed.
                        let mut bytes = self.held.take().unwrap_or_default();
                        bytes.push(byte);
                        self.at_line_start = false;
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
    fn an_at_line_without_a_message_goes_to_the_cli_and_ctrl_c_drops_it() {
        let mut router = InputRouter::new();
        assert_eq!(passed(&router.feed(b"@alone\r")), b"@alone\r");
        let routed = router.feed(b"@codex half\x03");
        assert!(sends(&routed).is_empty() && passed(&routed).is_empty());
        // After the dropped line, a normal line passes again.
        assert_eq!(passed(&router.feed(b"ls\r")), b"ls\r");
    }
}
