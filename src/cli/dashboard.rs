//! `synapse dashboard`: prints the address of the broker's web dashboard (starting the broker
//! when none runs) and, with `--open`, opens it in a browser when the machine has one.
//!
//! The address carries the page key of this broker start (`?key=`): a page opened with it acts
//! as the user (sends and cancels), one opened without it (or after a restart) reads only (see
//! `http::dashboard`).

use crate::client::Client;
use crate::config::Paths;
use hyper::StatusCode;

/// Programs that open a URL in the user's browser, tried in order.
const OPENERS: [&str; 3] = ["xdg-open", "open", "sensible-browser"];

pub async fn run(paths: &Paths, open: bool, json: bool) -> anyhow::Result<i32> {
    let mut client = Client::connect(paths, true).await?;
    let info = client.health().await?;
    let url = match client.page_key().await {
        Ok(key) => format!("http://127.0.0.1:{}/?key={}", info.port, key.key),
        // Not the user (inside an agent; with auth on and no key), or a broker older than the
        // key: the page reads only (with auth on it asks for the API key, which acts as well).
        Err(error) => {
            let hint = match error.status() {
                Some(StatusCode::NOT_FOUND) => "the running broker is older than the page key",
                Some(StatusCode::UNAUTHORIZED) => {
                    "the broker wants an API key (SYNAPSE_API_KEY); the page will ask for it"
                }
                Some(StatusCode::FORBIDDEN) => {
                    "run synapse dashboard from a plain shell, outside any agent, to send and cancel from it"
                }
                _ => return Err(error.into()),
            };
            eprintln!(
                "The page will be read-only without its key ({}): {hint}",
                crate::escape::visible(&error.to_string())
            );
            format!("http://127.0.0.1:{}/", info.port)
        }
    };
    if json {
        println!("{}", serde_json::json!({ "url": url }));
    } else {
        println!("{url}");
    }
    if !open {
        return Ok(0);
    }
    let mut failures = Vec::new();
    for opener in OPENERS {
        let launched = std::process::Command::new(opener)
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let Ok(mut child) = launched else { continue };
        // An opener hands the address to the browser and exits; one that fails (xdg-open with
        // no display) says so by its status. One still running after a while is taken to be
        // the browser itself, and left to run.
        let started = std::time::Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(Some(status)),
                Ok(None) if started.elapsed() < OPENER_PATIENCE => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Ok(None) => break Ok(None),
                Err(error) => break Err(error),
            }
        };
        // The first opener there is the one for this system: after its failure no other is
        // tried (on Debian, `open` is the console's openvt).
        match status {
            Ok(Some(status)) if !status.success() => failures.push(format!("{opener} failed ({status})")),
            Err(error) => failures.push(format!("{opener}: {error}")),
            Ok(_) => return Ok(0),
        }
        break;
    }
    // No browser here (a server, a container): the address is printed, which is what a user
    // needs to open it from elsewhere (an SSH tunnel, say).
    if failures.is_empty() {
        eprintln!("No browser found ({}): open {url} yourself", OPENERS.join(", "));
    } else {
        eprintln!("Could not open a browser ({}): open {url} yourself", failures.join("; "));
    }
    Ok(0)
}

/// How long an opener may take to hand the address over before it is taken to be running the
/// browser itself.
const OPENER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);
