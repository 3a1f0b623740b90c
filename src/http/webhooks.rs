//! `/webhooks`: register, list, remove, and the deliveries (SPEC §6).

use super::error::answer;
use super::extract::{parse_body, parse_query};
use super::{ApiError, ApiResult, AppState};
use crate::api;
use crate::broker::command::{Command, Outcome};
use crate::broker::webhooks::WebhookCommand;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::routing::get;
use serde::Deserialize;

pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/webhooks", get(list).post(register).delete(remove))
        .route("/webhooks/deliveries", get(deliveries))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    url: String,
    #[serde(default)]
    events: Vec<String>,
    #[serde(default)]
    secret: Option<String>,
}

async fn appended(state: &AppState, command: WebhookCommand) -> Result<(), ApiError> {
    match state.writer.submit(Command::Webhook(command)).await? {
        Outcome::Appended { seq } => {
            state.webhooks.caught_up(seq, state.shutdown.subscribe()).await;
            Ok(())
        }
        _ => Err(ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "unexpected answer from the writer")),
    }
}

async fn register(
    State(state): State<AppState>,
    _user: super::caller::TheUser,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let body: RegisterBody = parse_body(body)?;
    // One spelling per target: `http://H:80/x` and `http://h/x` are one hook (registered again
    // under the spelling it has, when an older version stored another).
    let normalised = crate::broker::outbound::normalise_url(body.url.trim())
        .map_err(|message| ApiError::bad(format!("Invalid webhook URL {message}")))?;
    state.delivery_current().await;
    let url = state.webhooks.lock().registered_spelling(&normalised).unwrap_or(normalised);
    // Refused now rather than at every delivery (each attempt checks again, on the address
    // it connects to).
    state
        .outbound_policy()
        .check_url(&url)
        .await
        .map_err(|reason| ApiError::bad(format!("Webhook URL {url} refused: {reason}")))?;
    // The secret goes to its own file; the log (served by GET /events) holds the reference.
    let secret_ref = match body.secret.filter(|secret| !secret.is_empty()) {
        Some(secret) => Some(crate::broker::webhooks::store_secret(&state.paths.home, &secret).map_err(|error| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot store the webhook secret: {error}"),
            )
        })?),
        None => None,
    };
    let command = WebhookCommand::Register { url: url.clone(), events: body.events, secret_ref: secret_ref.clone() };
    if let Err(error) = appended(&state, command).await {
        // Not stored (an unknown event name, say): no event names the file, so nothing else
        // would ever delete it.
        if let Some(reference) = &secret_ref
            && error.status().is_client_error()
        {
            crate::broker::webhooks::delete_secret(&state.paths.home, reference);
        }
        return Err(error);
    }
    let webhook = state.webhooks.lock().hook(&url).map(webhook_view);
    answer(&api::WebhookAnswer { webhook })
}

async fn list(State(state): State<AppState>, _user: super::caller::TheUser) -> ApiResult {
    state.delivery_current().await;
    answer(&api::WebhookList { webhooks: state.webhooks.lock().hooks().iter().map(webhook_view).collect() })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveQuery {
    url: Option<String>,
}

async fn remove(State(state): State<AppState>, _user: super::caller::TheUser, uri: axum::http::Uri) -> ApiResult {
    let query: RemoveQuery = parse_query(uri.query())?;
    let given = query.url.ok_or_else(|| ApiError::bad("DELETE /webhooks needs ?url=<registered url>"))?;
    state.delivery_current().await;
    // As registered (hooks of older versions kept their spelling), or in any spelling of it.
    let url = state.webhooks.lock().registered_spelling(&given);
    let Some(url) = url else {
        return Err(ApiError::not_found(format!("No webhook registered for {given}")));
    };
    appended(&state, WebhookCommand::Remove { url: url.clone() }).await?;
    answer(&api::Removed { removed: url })
}

async fn deliveries(State(state): State<AppState>, _user: super::caller::TheUser) -> ApiResult {
    state.delivery_current().await;
    // Viewed under the lock: copying every delivery first copied every pending body too.
    let deliveries = state.webhooks.lock().each_delivery().map(delivery_view).collect();
    answer(&api::WebhookDeliveries { deliveries })
}

fn webhook_view(hook: &crate::broker::webhooks::Hook) -> api::Webhook {
    api::Webhook {
        webhook_id: hook.webhook_id.clone(),
        url: hook.url.clone(),
        events: hook.events.clone(),
        has_secret: hook.has_secret,
        registered_seq: hook.registered_seq,
    }
}

fn delivery_view(delivery: &crate::broker::webhooks::Delivery) -> api::WebhookDelivery {
    api::WebhookDelivery {
        delivery_id: delivery.delivery_id.clone(),
        webhook_id: delivery.webhook_id.clone(),
        url: delivery.url.clone(),
        event: delivery.event.clone(),
        state: delivery.state.to_string(),
        attempts: delivery.attempts,
        last_status: delivery.last_status,
        last_error: delivery.last_error.clone(),
        next_attempt_ms: delivery.next_attempt_ms,
    }
}
