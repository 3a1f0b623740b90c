//! Requests the broker makes to other HTTP servers (webhook receivers, external agents):
//! plain HTTP/1.1 over TCP with a bounded time, no TLS.

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use std::time::Duration;

/// `http://host[:port][/path]`: (host, port, path).
pub fn parse_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = match url.strip_prefix("http://") {
        Some(rest) => rest,
        None if url.starts_with("https://") => {
            return Err(format!("'{url}': only http:// URLs are supported (this build has no TLS)"));
        }
        None => return Err(format!("'{url}' is not an http:// URL")),
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, port.parse::<u16>().map_err(|_| format!("'{url}': bad port '{port}'"))?),
        None => (authority, 80),
    };
    if host.is_empty() || host.contains(['@', ' ']) || port == 0 {
        return Err(format!("'{url}': bad host"));
    }
    Ok((host.trim_start_matches('[').trim_end_matches(']').to_string(), port, path.to_string()))
}

/// An answer: status and body.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// An open response whose body is read piece by piece (server-sent events).
pub type Streaming = hyper::Response<hyper::body::Incoming>;

async fn open(
    method: hyper::Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
) -> Result<Streaming, String> {
    let (host, port, path) = parse_url(url)?;
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|error| format!("cannot reach {host}:{port}: {error}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|error| format!("{url}: {error}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request =
        hyper::Request::builder().method(method).uri(path.as_str()).header("host", format!("{host}:{port}"));
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request =
        request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|error| format!("{url}: {error}"))?;
    sender.send_request(request).await.map_err(|error| format!("{url}: {error}"))
}

/// One request with its whole answer, within `limit`.
pub async fn request(
    method: hyper::Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<Vec<u8>>,
    limit: Duration,
) -> Result<Answer, String> {
    let exchange = async {
        let response = open(method, url, headers, body).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|error| format!("{url}: {error}"))?.to_bytes();
        Ok(Answer { status, body })
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("{url} did not answer within {:.1} s", limit.as_secs_f64())),
    }
}

/// Opens a streaming request (the headers must arrive within `limit`).
pub async fn stream(url: &str, limit: Duration) -> Result<Streaming, String> {
    match tokio::time::timeout(limit, open(hyper::Method::GET, url, &[("accept", "text/event-stream".into())], None))
        .await
    {
        Ok(result) => result,
        Err(_) => Err(format!("{url} did not answer within {:.1} s", limit.as_secs_f64())),
    }
}
