//! `synapse-bench-rawsend <socket> <agent>`: the request `synapse send <agent> bench
//! --no-response` makes, from a program that does nothing else (std only, no runtime, no
//! parsing beyond the status line), for `cli-send`'s raw-client figure: what a send costs a
//! process whose own code costs nothing, against the same broker (issue 16, tools/README.md).

use std::io::{Read, Write};

fn main() {
    std::process::exit(match send() {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("synapse-bench-rawsend: {error}");
            1
        }
    })
}

fn send() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(socket), Some(agent)) = (args.next(), args.next()) else {
        return Err(std::io::Error::other("usage: synapse-bench-rawsend <broker socket> <agent id>"));
    };
    // A fresh idempotency key per send, as the CLI makes one.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |now| now.as_nanos());
    let body = format!(
        r#"{{"to":"{agent}","text":"bench","response_expected":false,"idempotency_key":"raw-{}-{nanos}"}}"#,
        std::process::id()
    );
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    let request = format!(
        "POST /send HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    // The answer's head and its whole body (content-length), then the status.
    let mut answer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(std::io::Error::other("the broker closed the connection before answering"));
        }
        answer.extend_from_slice(&chunk[..read]);
        let Some(end) = answer.windows(4).position(|window| window == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if answer.len() >= end + 4 + length {
            if head.starts_with("http/1.1 200") {
                return Ok(());
            }
            return Err(std::io::Error::other(String::from_utf8_lossy(&answer).into_owned()));
        }
    }
}
