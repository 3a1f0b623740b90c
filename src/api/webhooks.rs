//! Webhooks that `POST /webhooks` registers and `GET /webhooks/deliveries` reports on.

use serde::{Deserialize, Serialize};

/// A registered webhook (its signing secret is never shown: only whether it has one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    pub webhook_id: String,
    pub url: String,
    pub events: Vec<String>,
    pub has_secret: bool,
    pub registered_seq: u64,
}

/// `POST /webhooks`: the webhook registered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookAnswer {
    #[serde(default)]
    pub webhook: Option<Webhook>,
}

/// `GET /webhooks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// One delivery of the outbox: a webhook's, or an A2A push notification's (`webhook_id`
/// `push:<task>:<config>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookDelivery {
    pub delivery_id: String,
    pub webhook_id: String,
    pub url: String,
    pub event: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: u32,
    #[serde(default)]
    pub last_status: Option<u16>,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub next_attempt_ms: Option<u64>,
}

/// `GET /webhooks/deliveries`: finished (the latest 500) and pending deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookDeliveries {
    pub deliveries: Vec<WebhookDelivery>,
}
