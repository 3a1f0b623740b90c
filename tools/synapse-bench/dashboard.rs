//! `dashboard`: how long the web dashboard takes to show a busy broker (issue 17). A broker with
//! 50 registered agents and a log of 100,000 events (sends between them, status changes); then
//! headless Chromium (through chromedriver, the tests' WebDriver client) opens the page five
//! times, and the page's own `performance.mark('synapse-first-render')` — set once its first
//! full render (every card, the message list, the event log) is on screen — gives the time from
//! navigation start. RESULT is the median. `SYNAPSE_BENCH_DASHBOARD_SCREENSHOT=file.png` saves
//! what the last load showed.

#[path = "../../tests/support/webdriver.rs"]
mod webdriver;

use crate::common::{self, BenchDir, BrokerProcess, Options, Samples, SynapseEnv};
use anyhow::{Context, Result, bail};
use synapse::api;

const AGENTS: usize = 50;
const EVENTS: u64 = 100_000;
/// Concurrent senders filling the log (each its own connection to the broker).
const SENDERS: usize = 16;
const LOADS: usize = 5;

pub async fn run(options: &Options) -> Result<()> {
    let dir = BenchDir::new("dashboard")?;
    let env = SynapseEnv::new(&options.synapse, &dir)?;
    let broker = BrokerProcess::start(env, dir.root.join("broker.log")).await?;
    let mut client = broker.connect().await?;
    let mut agents = Vec::new();
    for _ in 0..AGENTS {
        agents.push(common::register_agent(&mut client).await?);
    }
    let ids: Vec<String> = agents.iter().map(|agent| agent.id.clone()).collect();
    let filled = std::time::Instant::now();
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let mut client = broker.connect().await?;
        let ids = ids.clone();
        senders.push(tokio::spawn(async move {
            let mut state = sender as u64;
            let mut sent = 0u64;
            // Each send appends three events (task, message, ticket); every tenth also a status change.
            while sent * 3 * SENDERS as u64 <= EVENTS {
                let to = &ids[(common::splitmix(&mut state) % ids.len() as u64) as usize];
                let mut request =
                    api::SendRequest::new(to.clone(), format!("message {sender}-{sent}: please look at <b>this</b>"));
                request.priority = 1 + (sent % 5) as u8;
                client.send(&request).await.with_context(|| format!("send {sent} of sender {sender}"))?;
                sent += 1;
            }
            anyhow::Ok(())
        }));
    }
    for sender in senders {
        sender.await??;
    }
    // A fresh connection: the first one sat idle while the senders ran.
    let mut client = broker.connect().await?;
    for (index, agent) in agents.iter().enumerate() {
        client.set_secret(agent.secret.clone());
        let status =
            if index % 3 == 0 { synapse::event::AgentStatus::Processing } else { synapse::event::AgentStatus::Ready };
        client.set_status(&agent.id, &api::StatusUpdate { status, note: None }).await.context("status change")?;
    }
    client.clear_secret();
    let info = client.health().await.context("health")?;
    println!("{AGENTS} agents, {} events in {:.1} s", info.head, filled.elapsed().as_secs_f64());

    let url = format!("http://127.0.0.1:{}/", info.port);
    let samples = tokio::task::spawn_blocking(move || first_renders(&url)).await??;
    println!("first render: {}", samples.summary());
    common::result("dashboard_first_render_ms", samples.median(), 0, "ms");
    broker.stop()
}

/// Opens the page [`LOADS`] times (after one warm-up load); the page's own first-render mark each time.
fn first_renders(url: &str) -> Result<Samples> {
    let Some(browser) = webdriver::Browser::start("dashboard scenario") else {
        bail!("the dashboard scenario needs chromium and chromedriver (apt-get install chromium chromium-driver)");
    };
    browser.set_size(1280, 1000);
    let mut millis = Vec::new();
    for load in 0..=LOADS {
        browser.goto("about:blank");
        browser.goto(url);
        let mark = browser.wait_value(
            "the first render",
            "const mark = performance.getEntriesByName('synapse-first-render')[0];
             return [mark ? mark.startTime : null, document.querySelectorAll('#agents .card').length, document.getElementById('message-count').textContent,
                     document.getElementById('error').textContent, document.getElementById('connection').textContent];",
            vec![],
            |value| !value[0].is_null(),
        );
        let cards = mark[1].as_u64().context("card count")?;
        if cards != AGENTS as u64 {
            bail!("the page showed {cards} cards, not {AGENTS}");
        }
        if load > 0 {
            millis.push(mark[0].as_f64().context("mark time")?);
        }
        if load == LOADS
            && let Some(path) = std::env::var_os("SYNAPSE_BENCH_DASHBOARD_SCREENSHOT")
        {
            browser.screenshot(std::path::Path::new(&path));
        }
    }
    Ok(Samples::from_millis(millis))
}
