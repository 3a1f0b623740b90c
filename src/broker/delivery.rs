//! The delivery worker: follows the log into the webhook outbox and the external agents' list,
//! and posts the webhook deliveries that are due (see [`super::webhooks`] for the outbox, the
//! secrets and the retry rule).
//!
//! Every attempt's outcome goes back into the log through the writer before the outbox forgets
//! it is in flight, so a restart resumes where delivery stopped. Targets are reached only
//! through [`super::outbound`] with the broker's policy at the time of the attempt.

use super::BrokerState;
use super::command::Command;
use super::outbound;
use super::tail;
use super::webhooks::{self, Delivery, PostResult, SecretSource, WebhookCommand, Webhooks};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How long one delivery attempt may take once connected.
const ATTEMPT_TIMEOUT: Duration = outbound::READ_TIMEOUT;

/// The delivery worker: follows the log into the outbox (and the external agents' list) and
/// delivers what is due. `Webhooks::caught_up` waits for it.
pub fn spawn(state: Arc<BrokerState>) {
    tokio::spawn(async move {
        let mut cursor = 0;
        let mut in_flight: HashSet<(String, u32)> = HashSet::new();
        let mut shutdown = state.shutdown.subscribe();
        loop {
            loop {
                let Ok(batch) = tail::next_batch(&state, cursor, false).await else { return };
                if batch.is_empty() {
                    break;
                }
                let mut outbox = state.webhooks.lock();
                for envelope in &batch {
                    outbox.apply(envelope);
                    // The same tail keeps the external agents' projection.
                    state.externals.apply(envelope);
                    cursor = envelope.seq;
                }
            }
            state.webhooks.cursor.send_replace(cursor);
            let now = crate::time::now_ms();
            let (due, next, unused) = {
                let mut outbox = state.webhooks.lock();
                in_flight.retain(|(id, attempts)| Webhooks::is_awaited(&outbox, id, *attempts));
                (outbox.due(now, &in_flight), outbox.next_due(), outbox.take_unused_secrets())
            };
            for reference in unused {
                webhooks::delete_secret(&state.paths.home, &reference);
            }
            for (delivery, secret) in due {
                in_flight.insert((delivery.delivery_id.clone(), delivery.attempts));
                let state = state.clone();
                tokio::spawn(async move {
                    let result = post(&state, &delivery, secret.as_ref()).await;
                    let attempt = webhooks::record(&delivery, result, crate::time::now_ms());
                    let _ = state.writer.submit(Command::Webhook(WebhookCommand::RecordAttempt(attempt))).await;
                });
            }
            let wait = next.filter(|at| *at > now).map(|at| Duration::from_millis(at - now));
            let in_flight_only = next.is_some_and(|at| at <= now);
            tokio::select! {
                moved = tail::wait_past(&state, cursor) => if !moved { return },
                _ = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))), if wait.is_some() && !in_flight_only => {}
                _ = shutdown.wait_for(|stopping| *stopping) => return,
            }
        }
    });
}

/// One POST; Ok(status, note) or Err(network error, refused target, unreadable secret).
async fn post(state: &BrokerState, delivery: &Delivery, secret: Option<&SecretSource>) -> PostResult {
    let mut headers =
        vec![("x-synapse-event", delivery.event.clone()), ("x-synapse-event-id", delivery.delivery_id.clone())];
    if let Some(source) = secret {
        let secret = webhooks::read_secret(&state.paths.home, source)?;
        let signature = crate::secret::to_hex(&webhooks::hmac_sha256(secret.as_bytes(), delivery.body.as_bytes()));
        headers.push(("x-synapse-signature", format!("sha256={signature}")));
    }
    // A push notification authenticates as its config says (A2A: the client's token, and the
    // credentials under their scheme).
    if let Some(push) = &delivery.push {
        let read = |reference: &String| {
            webhooks::read_secret(&state.paths.home, &SecretSource::File(reference.clone()))
                .map(|text| text.trim_end_matches(['\r', '\n']).to_string())
        };
        if let Some(token) = &push.token_ref {
            headers.push(("x-a2a-notification-token", read(token)?));
        }
        if let (Some(scheme), Some(credentials)) = (&push.scheme, &push.credentials_ref) {
            headers.push(("authorization", format!("{scheme} {}", read(credentials)?)));
        }
    }
    let answer = outbound::request(
        &state.outbound_policy(),
        hyper::Method::POST,
        &delivery.url,
        &headers,
        Some(delivery.body.clone().into_bytes()),
        ATTEMPT_TIMEOUT,
    )
    .await?;
    let note = answer.truncated.then(|| {
        format!("the answer's body is longer than {} bytes; reading stopped there", outbound::BODY_LIMIT_BYTES)
    });
    Ok((answer.status, note))
}
