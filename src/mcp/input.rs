//! What the MCP client writes, made readable before the SDK parses it.
//!
//! A JavaScript or Python client encodes a string cut in the middle of a surrogate pair (an
//! emoji cut by a length limit) as a lone `\uD83D`: JSON that `serde_json` refuses as invalid
//! syntax, and an SDK that gets invalid JSON answers nothing (no id to answer), so the model's
//! tool call waited for the CLI's own time limit. Each line is passed on with every lone
//! surrogate escape replaced by `\uFFFD`, the replacement character, as a browser's
//! `TextEncoder` does.

use std::borrow::Cow;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt};

/// The longest line mended; a longer one is passed on as it is (the SDK refuses lines of more
/// than 16 MiB).
const MEND_AT_MOST: usize = 16 << 20;

/// `line` with each `\uXXXX` escape of a surrogate that is not half of a pair replaced by
/// `\uFFFD`. Escaped backslashes are skipped, so `\\uD83D` (text, not an escape) stays.
pub fn mend_lone_surrogates(line: &[u8]) -> Cow<'_, [u8]> {
    let escape_at = |at: usize| -> Option<u16> {
        let digits = line.get(at..at + 6)?.strip_prefix(b"\\u")?;
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let mut mended: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut at = 0;
    while at < line.len() {
        if line[at] != b'\\' {
            at += 1;
            continue;
        }
        let Some(unit) = escape_at(at) else {
            at += 2;
            continue;
        };
        let paired =
            (0xD800..0xDC00).contains(&unit) && escape_at(at + 6).is_some_and(|next| (0xDC00..0xE000).contains(&next));
        if paired {
            at += 12;
        } else if (0xD800..0xE000).contains(&unit) {
            let out = mended.get_or_insert_with(|| Vec::with_capacity(line.len()));
            out.extend_from_slice(&line[copied..at]);
            out.extend_from_slice(b"\\uFFFD");
            at += 6;
            copied = at;
        } else {
            at += 6;
        }
    }
    match mended {
        Some(mut out) => {
            out.extend_from_slice(&line[copied..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(line),
    }
}

/// A reader of `input` whose lines are mended ([`mend_lone_surrogates`]) on their way, by a
/// task that ends with `input`. A line longer than [`MEND_AT_MOST`] is passed on as it comes,
/// never held whole.
pub fn mended(input: impl AsyncRead + Unpin + Send + 'static) -> tokio::io::DuplexStream {
    let (reader, mut writer) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut input = tokio::io::BufReader::new(input);
        let mut line = Vec::new();
        let mut passing = false;
        loop {
            let (chunk, ends_line) = match input.fill_buf().await {
                Ok(available) if !available.is_empty() => {
                    let newline = available.iter().position(|byte| *byte == b'\n');
                    let take = newline.map_or(available.len(), |at| at + 1);
                    (available[..take].to_vec(), newline.is_some())
                }
                _ => break,
            };
            input.consume(chunk.len());
            let written = if passing {
                passing = !ends_line;
                writer.write_all(&chunk).await
            } else {
                line.extend_from_slice(&chunk);
                if ends_line {
                    let result = writer.write_all(&mend_lone_surrogates(&line)).await;
                    line.clear();
                    result
                } else if line.len() > MEND_AT_MOST {
                    passing = true;
                    let result = writer.write_all(&line).await;
                    line.clear();
                    result
                } else {
                    Ok(())
                }
            };
            if written.is_err() {
                return;
            }
        }
        // A last line without its newline goes on too (mended, unless it was passed on).
        let _ = writer.write_all(&mend_lone_surrogates(&line)).await;
    });
    reader
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mend(text: &str) -> String {
        String::from_utf8(mend_lone_surrogates(text.as_bytes()).into_owned()).unwrap()
    }

    #[test]
    fn lone_surrogates_become_the_replacement_character_and_the_rest_stays() {
        assert_eq!(mend(r#"{"t":"cut \uD83D"}"#), r#"{"t":"cut \uFFFD"}"#);
        assert_eq!(
            mend(r#"{"t":"\uDE00 and \ud83d\ude00 and \uD83D\u0041"}"#),
            r#"{"t":"\uFFFD and \ud83d\ude00 and \uFFFD\u0041"}"#
        );
        assert_eq!(mend(r#"{"t":"\\uD83D is text"}"#), r#"{"t":"\\uD83D is text"}"#);
        assert_eq!(mend(r#"{"t":"end \uD83"#), r#"{"t":"end \uD83"#);
        assert!(matches!(mend_lone_surrogates(b"{\"t\":\"plain \\u00e9\"}"), Cow::Borrowed(_)));
        let mended = mend(r#"{"t":"a\uDBFF"}"#);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&mended).unwrap()["t"], "a\u{fffd}");
    }
}
