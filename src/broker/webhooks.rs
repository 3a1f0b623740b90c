//! Webhooks (SPEC §6): notifications of task events to registered URLs, with an outbox that
//! lives in the log.
//!
//! Registrations and every delivery attempt are events. The outbox is an in-memory projection
//! of the log, rebuilt when the broker starts from the delivery worker's last snapshot and the
//! log after it ([`Outbox::apply`] is pure), so a restart resumes delivery where it stopped. A
//! delivery's id (`<webhook8>-<seq>`) is stable across attempts and restarts, for receivers to
//! dedupe on.
//!
//! Secrets: a signing secret never enters the log (which `GET /events` serves). It is written
//! to `$SYNAPSE_HOME/webhook-secrets/<ref>` (0600, fsynced before the registration commits) and
//! the event holds only the reference; the delivery worker (`broker::delivery`) reads the file when it signs. Logs
//! from before this carry `secret` inline: still read, never written.
//!
//! Targets: every attempt goes through [`super::outbound`] with the broker's policy (no
//! private targets unless allowed, never the broker itself), a 10 s limit and a 64 KB cap on
//! the answer's body.
//!
//! Retries: 5xx answers and network errors are retried with exponential backoff
//! (`SYNAPSE_WEBHOOK_RETRY_BASE_MS`, default 1000 ms, doubling, at most [`MAX_ATTEMPTS`]);
//! 2xx and 4xx answers end a delivery.

use super::command::decision::{Answer, CommandError, DecideError, Decision};
use crate::event::{Envelope, Event, TaskState};
use crate::store::Projections;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Mutex;
use tokio::sync::watch;

pub const EVENTS: [&str; 4] = ["task.completed", "task.failed", "task.canceled", "task.replied"];
pub const MAX_ATTEMPTS: u32 = 8;
/// The directory of the signing secrets, inside `SYNAPSE_HOME`.
pub const SECRETS_DIR: &str = "webhook-secrets";
/// Finished deliveries kept for `GET /webhooks/deliveries`.
const KEPT_FINISHED: usize = 500;
/// Tasks that ended whose push configs stay listed: past this many, the configs of the task
/// that ended first are forgotten (an A2A client that sets a config for every task would
/// otherwise grow the outbox, and every snapshot of it, with each task).
const KEPT_ENDED_PUSH: usize = 1_000;

#[derive(Debug, Clone)]
pub enum WebhookCommand {
    /// `secret_ref`: the file [`store_secret`] wrote, never the secret itself.
    Register {
        url: String,
        events: Vec<String>,
        secret_ref: Option<String>,
    },
    Remove {
        url: String,
    },
    RecordAttempt(Attempt),
    /// An A2A client's push notification config (its secrets already in files).
    SetPushConfig(PushConfig),
    DeletePushConfig {
        task_id: String,
        config_id: String,
    },
}

/// A push notification config of an A2A client's task (`push_config_set`): every later status
/// change of the task is posted to `url`, as a delivery of the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushConfig {
    pub task_id: String,
    pub config_id: String,
    pub context_id: String,
    pub url: String,
    pub auth: PushAuth,
}

/// How a push delivery authenticates: references of files under [`SECRETS_DIR`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PushAuth {
    /// Sent as `X-A2A-Notification-Token`.
    pub token_ref: Option<String>,
    /// With `credentials_ref`: sent as `Authorization: <scheme> <credentials>`.
    pub scheme: Option<String>,
    pub credentials_ref: Option<String>,
}

/// Is `id` a config id a client may choose (it names deliveries and appears in URLs)?
pub fn is_valid_config_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub delivery_id: String,
    pub webhook_id: String,
    pub event: String,
    pub attempt: u32,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub next_attempt_ms: Option<u64>,
}

pub use super::outbound::parse_url;

pub fn decide(view: &Projections<'_>, command: &WebhookCommand) -> Result<Decision, DecideError> {
    let task_ended = match command {
        WebhookCommand::SetPushConfig(config) => {
            view.task_row(&config.task_id)?.is_some_and(|task| task.state.is_final())
        }
        _ => false,
    };
    Ok(Decision { actor: None, events: vec![event_of(command, task_ended)?], answer: Answer::Appended })
}

/// The event of `command`; `task_ended`: a push config's task has ended already.
fn event_of(command: &WebhookCommand, task_ended: bool) -> Result<Event, DecideError> {
    Ok(match command {
        WebhookCommand::Register { url, events, secret_ref } => {
            parse_url(url).map_err(|message| CommandError::bad(format!("Invalid webhook URL {message}")))?;
            for event in events {
                if !EVENTS.contains(&event.as_str()) {
                    return Err(CommandError::bad(format!(
                        "Unknown webhook event '{event}' (one of {})",
                        EVENTS.join(", ")
                    ))
                    .into());
                }
            }
            let events =
                if events.is_empty() { EVENTS.iter().map(|e| e.to_string()).collect() } else { events.clone() };
            Event::WebhookRegistered {
                webhook_id: uuid::Uuid::new_v4().to_string(),
                url: url.clone(),
                events,
                secret: None,
                secret_ref: secret_ref.clone(),
            }
        }
        WebhookCommand::Remove { url } => Event::WebhookRemoved { webhook_id: String::new(), url: url.clone() },
        WebhookCommand::RecordAttempt(attempt) => Event::WebhookDeliveryAttempted {
            delivery_id: attempt.delivery_id.clone(),
            webhook_id: attempt.webhook_id.clone(),
            event: attempt.event.clone(),
            attempt: attempt.attempt,
            status: attempt.status,
            error: attempt.error.clone(),
            next_attempt_ms: attempt.next_attempt_ms,
        },
        WebhookCommand::SetPushConfig(config) => {
            parse_url(&config.url)
                .map_err(|message| CommandError::bad(format!("Invalid push notification URL {message}")))?;
            if !is_valid_config_id(&config.config_id) {
                return Err(CommandError::bad(format!(
                    "Invalid push notification config id '{}' (1-64 letters, digits, '-', '_' or '.')",
                    config.config_id
                ))
                .into());
            }
            Event::PushConfigSet {
                task_id: config.task_id.clone(),
                config_id: config.config_id.clone(),
                context_id: config.context_id.clone(),
                url: config.url.clone(),
                token_ref: config.auth.token_ref.clone(),
                auth_scheme: config.auth.scheme.clone(),
                credentials_ref: config.auth.credentials_ref.clone(),
                task_ended,
            }
        }
        WebhookCommand::DeletePushConfig { task_id, config_id } => {
            Event::PushConfigDeleted { task_id: task_id.clone(), config_id: config_id.clone() }
        }
    })
}

/// A registration. Serialized for the delivery worker's snapshot only (the API has its own view).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hook {
    pub webhook_id: String,
    pub url: String,
    pub events: Vec<String>,
    /// Where the signing secret is (the secret itself only for old logs).
    pub secret: Option<SecretSource>,
    pub has_secret: bool,
    pub registered_seq: u64,
}

/// A delivery of the outbox. Serialized for the delivery worker's snapshot only (the API has
/// its own view).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    pub delivery_id: String,
    pub webhook_id: String,
    pub url: String,
    pub event: String,
    /// "pending", "delivered" or "failed".
    pub state: String,
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub next_attempt_ms: Option<u64>,
    pub body: String,
    /// A push notification's authentication (none for a webhook's delivery, which is signed).
    pub push: Option<PushAuth>,
}

impl Delivery {
    /// A new delivery, due at `at_ms` (the time of the event it reports).
    fn due(delivery_id: String, webhook_id: String, url: &str, event: &str, at_ms: u64, body: Value) -> Delivery {
        Delivery {
            delivery_id,
            webhook_id,
            url: url.to_string(),
            event: event.to_string(),
            state: "pending".into(),
            attempts: 0,
            last_status: None,
            last_error: None,
            next_attempt_ms: Some(at_ms),
            body: body.to_string(),
            push: None,
        }
    }

    fn with_push(self, auth: PushAuth) -> Delivery {
        Delivery { push: Some(auth), ..self }
    }
}

/// Where a hook's signing secret is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SecretSource {
    /// In the registration event (logs written before secrets moved out of the log).
    Inline(String),
    /// In `$SYNAPSE_HOME/webhook-secrets/<ref>`.
    File(String),
}

/// Is `reference` a name [`store_secret`] could have made (no path tricks from the log)?
fn is_valid_reference(reference: &str) -> bool {
    !reference.is_empty() && reference.len() <= 64 && reference.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Writes a signing secret to its own file (0600, in a 0700 directory, fsynced) and returns
/// its reference, for the registration event.
pub fn store_secret(home: &std::path::Path, secret: &str) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = home.join(SECRETS_DIR);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    let reference = uuid::Uuid::new_v4().to_string();
    let mut file = std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(dir.join(&reference))?;
    file.write_all(secret.as_bytes())?;
    file.sync_all()?;
    // The file's name must survive a crash too, before the event that names it commits.
    std::fs::File::open(&dir)?.sync_all()?;
    Ok(reference)
}

/// Deletes a secret file nothing names any more (see [`Outbox::take_unused_secrets`]); one
/// already gone (deleted before a restart) is fine. False when the file is still there: the
/// caller retires it again ([`Outbox::retire_again`]), to try later.
pub fn delete_secret(home: &std::path::Path, reference: &str) -> bool {
    if !is_valid_reference(reference) {
        return true;
    }
    let path = home.join(SECRETS_DIR).join(reference);
    match std::fs::remove_file(&path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!("cannot delete the retired secret {}: {error}", path.display());
            false
        }
        _ => true,
    }
}

/// Reads the secret of a hook.
pub fn read_secret(home: &std::path::Path, source: &SecretSource) -> Result<String, String> {
    match source {
        SecretSource::Inline(secret) => Ok(secret.clone()),
        SecretSource::File(reference) if is_valid_reference(reference) => {
            let path = home.join(SECRETS_DIR).join(reference);
            std::fs::read_to_string(&path)
                .map_err(|error| format!("cannot read the signing secret {}: {error}", path.display()))
        }
        SecretSource::File(reference) => Err(format!("'{reference}' is not a webhook secret reference")),
    }
}

/// The webhook projection: registrations, pending and recently finished deliveries. Serialized
/// whole in the delivery worker's snapshot (`broker::delivery`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outbox {
    hooks: BTreeMap<String, Hook>,
    pending: BTreeMap<String, Delivery>,
    finished: VecDeque<Delivery>,
    /// Push notification configs: task id, then config id.
    push: BTreeMap<String, BTreeMap<String, PushConfig>>,
    /// The tasks of `push` in a final state, by the event that ended them (oldest first).
    ended_push: BTreeMap<u64, String>,
    /// The same tasks, to their key in `ended_push`.
    ended_push_at: BTreeMap<String, u64>,
    /// Messages of unverified external senders that gave an endpoint and expect a reply: by the
    /// receiver's task, where its reply goes. Taken by the first reply, or dropped when the
    /// sender's side of the task ends without one (no reply can be posted then).
    external_replies: BTreeMap<String, ExternalReply>,
    /// The sender's task of each of `external_replies`, to the receiver's task (its key there).
    external_reply_senders: BTreeMap<String, String>,
    /// Secret files (references under [`SECRETS_DIR`]) that no hook or push config names any
    /// more: a removed hook's, a deleted config's, and those of a task that reached a final
    /// state (its last notifications carry their own copy of the references). The worker
    /// deletes each once no pending delivery needs it ([`Outbox::take_unused_secrets`]).
    retired_secrets: std::collections::BTreeSet<String>,
}

impl PushAuth {
    /// The secret files this authentication names.
    fn references(&self) -> impl Iterator<Item = &String> {
        self.token_ref.iter().chain(self.credentials_ref.iter())
    }

    /// Forgets the secret files it names, and gives their references (to retire them).
    fn take_references(&mut self) -> impl Iterator<Item = String> {
        self.token_ref.take().into_iter().chain(self.credentials_ref.take())
    }
}

/// Where the reply to an unverified external sender's message goes (a Python Synapse agent).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExternalReply {
    /// The sender's endpoint (its `/tasks/send` gets the reply).
    endpoint: String,
    /// The sender's task, which the reply names (`in_reply_to`).
    task_id: Option<String>,
    /// Our task for the sender's side (the key of `external_reply_senders`).
    sender_task_id: String,
}

/// The `webhook_id` of a push config's deliveries (their attempts are recorded as a webhook's).
fn push_delivery_owner(task_id: &str, config_id: &str) -> String {
    format!("push:{task_id}:{config_id}")
}

/// A task's new status, for its push configs: the A2A 1.0 `StreamResponse` with a
/// `statusUpdate` (the client reads the task itself for its artifacts).
fn push_status(event: &Event) -> Option<(&str, TaskState, Option<&str>)> {
    match event {
        Event::TaskStateChanged { task_id, state, error, .. } => Some((task_id, *state, error.as_deref())),
        Event::TaskCanceled { task_id, reason, .. } => Some((task_id, TaskState::Canceled, reason.as_deref())),
        _ => None,
    }
}

fn task_event(event: &Event) -> Option<(&'static str, Value)> {
    match event {
        Event::TaskStateChanged { task_id, state, artifacts, error, .. } => {
            let name = match state {
                TaskState::Completed => "task.completed",
                TaskState::Failed => "task.failed",
                TaskState::Canceled => "task.canceled",
                _ => return None,
            };
            Some((name, json!({"task_id": task_id, "state": state, "artifacts": artifacts, "error": error})))
        }
        Event::TaskCanceled { task_id, reason, .. } => {
            Some(("task.canceled", json!({"task_id": task_id, "state": "canceled", "reason": reason})))
        }
        Event::ReplyPosted { task_id, sender_task_id, from, to, text, .. } => Some((
            "task.replied",
            json!({"task_id": task_id, "sender_task_id": sender_task_id, "from": from, "to": to, "text": text}),
        )),
        _ => None,
    }
}

impl Outbox {
    /// Applies one event. Pure: the same log gives the same outbox. A change to what it keeps
    /// or how it applies an event changes `broker::delivery::SNAPSHOT_VERSION` too, or a start
    /// would take a snapshot made by the old rule for the new one's.
    pub fn apply(&mut self, envelope: &Envelope) {
        match &envelope.event {
            Event::WebhookRegistered { webhook_id, url, events, secret, secret_ref } => {
                let secret = match (secret_ref, secret) {
                    (Some(reference), _) => Some(SecretSource::File(reference.clone())),
                    (None, Some(secret)) => Some(SecretSource::Inline(secret.clone())),
                    (None, None) => None,
                };
                // The same URL again replaces its registration: the deliveries still pending
                // go on under the new one (signed with its secret, dropped by its removal),
                // and the old secret's file goes.
                if let Some(old) = self.hooks.get(url) {
                    let old_id = old.webhook_id.clone();
                    if let Some(SecretSource::File(reference)) = &old.secret
                        && !matches!(&secret, Some(SecretSource::File(new)) if new == reference)
                    {
                        self.retired_secrets.insert(reference.clone());
                    }
                    for delivery in self.pending.values_mut().filter(|delivery| delivery.webhook_id == old_id) {
                        delivery.webhook_id = webhook_id.clone();
                    }
                }
                self.hooks.insert(
                    url.clone(),
                    Hook {
                        webhook_id: webhook_id.clone(),
                        url: url.clone(),
                        events: events.clone(),
                        has_secret: secret.is_some(),
                        secret,
                        registered_seq: envelope.seq,
                    },
                );
            }
            Event::WebhookRemoved { url, .. } => {
                if let Some(hook) = self.hooks.remove(url) {
                    self.pending.retain(|_, delivery| delivery.webhook_id != hook.webhook_id);
                    if let Some(SecretSource::File(reference)) = hook.secret {
                        self.retired_secrets.insert(reference);
                    }
                }
            }
            Event::WebhookDeliveryAttempted { delivery_id, attempt, status, error, next_attempt_ms, .. } => {
                if let Some(mut delivery) = self.pending.remove(delivery_id) {
                    delivery.attempts = *attempt;
                    delivery.last_status = *status;
                    delivery.last_error = error.clone();
                    delivery.next_attempt_ms = *next_attempt_ms;
                    if next_attempt_ms.is_some() {
                        self.pending.insert(delivery_id.clone(), delivery);
                    } else {
                        delivery.state =
                            if status.is_some_and(|s| (200..300).contains(&s)) { "delivered" } else { "failed" }.into();
                        // Never sent again: the body (a reply's text, up to a message's 16 MiB)
                        // would only weigh on memory and on every snapshot.
                        delivery.body = String::new();
                        self.finished.push_back(delivery);
                        if self.finished.len() > KEPT_FINISHED {
                            self.finished.pop_front();
                        }
                    }
                }
            }
            Event::PushConfigSet {
                task_id,
                config_id,
                context_id,
                url,
                token_ref,
                auth_scheme,
                credentials_ref,
                task_ended,
            } => {
                let mut config = PushConfig {
                    task_id: task_id.clone(),
                    config_id: config_id.clone(),
                    context_id: context_id.clone(),
                    url: url.clone(),
                    auth: PushAuth {
                        token_ref: token_ref.clone(),
                        scheme: auth_scheme.clone(),
                        credentials_ref: credentials_ref.clone(),
                    },
                };
                // A config set after its task ended gets no notification: its secrets are not
                // needed, and it counts among the configs of tasks that ended from now on.
                if *task_ended {
                    self.retired_secrets.extend(config.auth.take_references());
                }
                let named: Vec<String> = config.auth.references().cloned().collect();
                let replaced = self.push.entry(task_id.clone()).or_default().insert(config_id.clone(), config);
                // The config it replaces named secret files of its own.
                for reference in replaced.iter().flat_map(|old| old.auth.references()) {
                    if !named.contains(reference) {
                        self.retired_secrets.insert(reference.clone());
                    }
                }
                if *task_ended {
                    self.set_push_ended(task_id, Some(envelope.seq));
                }
            }
            Event::PushConfigDeleted { task_id, config_id } => {
                if let Some(configs) = self.push.get_mut(task_id) {
                    if let Some(config) = configs.remove(config_id) {
                        self.retired_secrets.extend(config.auth.references().cloned());
                    }
                    if configs.is_empty() {
                        self.push.remove(task_id);
                        self.set_push_ended(task_id, None);
                    }
                }
                let owner = push_delivery_owner(task_id, config_id);
                self.pending.retain(|_, delivery| delivery.webhook_id != owner);
            }
            // A message that expects no reply (no sender's task) can never get one.
            Event::MessageSent {
                task_id,
                unverified_sender: Some(_),
                sender_endpoint: Some(endpoint),
                external_task_id,
                sender_task_id: Some(sender_task_id),
                ..
            } => {
                let reply = ExternalReply {
                    endpoint: endpoint.clone(),
                    task_id: external_task_id.clone(),
                    sender_task_id: sender_task_id.clone(),
                };
                self.external_reply_senders.insert(sender_task_id.clone(), task_id.clone());
                self.external_replies.insert(task_id.clone(), reply);
            }
            other => {
                if let Event::ReplyPosted { task_id, from, text, .. } = other
                    && let Some(reply) = self.external_replies.remove(task_id)
                {
                    self.external_reply_senders.remove(&reply.sender_task_id);
                    self.deliver_external_reply(envelope, task_id, from, text, reply);
                }
                // A reply comes before the sender's task completes (`decide_reply`); once that
                // task has ended, the broker refuses replies to it.
                if let Some((task_id, state, _)) = push_status(other)
                    && state.is_final()
                    && let Some(receiver_task) = self.external_reply_senders.remove(task_id)
                {
                    self.external_replies.remove(&receiver_task);
                }
                if let Some((task_id, state, reason)) = push_status(other)
                    && let Some(configs) = self.push.get(task_id)
                {
                    for config in configs.values() {
                        let mut status = json!({
                            "state": state.a2a_name(),
                            "timestamp": crate::time::rfc3339(envelope.time_ms),
                        });
                        if let Some(reason) = reason {
                            status["message"] = json!({
                                "messageId": format!("{task_id}-status-{}", envelope.seq),
                                "role": "ROLE_AGENT",
                                "parts": [{"text": reason}],
                            });
                        }
                        let body = json!({"statusUpdate": {
                            "taskId": task_id,
                            "contextId": config.context_id,
                            "status": status,
                        }});
                        let delivery_id =
                            format!("{}-{}-{}", crate::event::short_id(task_id), config.config_id, envelope.seq);
                        let owner = push_delivery_owner(task_id, &config.config_id);
                        let delivery =
                            Delivery::due(delivery_id, owner, &config.url, "task.status", envelope.time_ms, body)
                                .with_push(config.auth.clone());
                        self.pending.insert(delivery.delivery_id.clone(), delivery);
                    }
                }
                // A final state is the task's last change: its configs stay listed (those of
                // the last `KEPT_ENDED_PUSH` tasks that ended), their secrets go once the last
                // notifications are done.
                if let Some((task_id, state, _)) = push_status(other)
                    && let Some(configs) = self.push.get_mut(task_id)
                {
                    if state.is_final() {
                        for config in configs.values_mut() {
                            self.retired_secrets.extend(config.auth.take_references());
                        }
                        self.set_push_ended(task_id, Some(envelope.seq));
                    } else {
                        self.set_push_ended(task_id, None);
                    }
                }
                let Some((name, data)) = task_event(other) else { return };
                for hook in self.hooks.values().filter(|hook| hook.events.iter().any(|e| e == name)) {
                    let delivery_id = format!("{}-{}", crate::event::short_id(&hook.webhook_id), envelope.seq);
                    let body = json!({
                        "event": name,
                        "event_id": delivery_id,
                        "timestamp": crate::time::rfc3339(envelope.time_ms),
                        "data": data,
                    });
                    let delivery =
                        Delivery::due(delivery_id, hook.webhook_id.clone(), &hook.url, name, envelope.time_ms, body);
                    self.pending.insert(delivery.delivery_id.clone(), delivery);
                }
            }
        }
    }

    /// Records that a task with push configs ended at event `seq` (None: it has not, or has
    /// no configs any more), and forgets the configs of the task that ended first when more
    /// than [`KEPT_ENDED_PUSH`] have. Their pending notifications carry their own copies.
    fn set_push_ended(&mut self, task_id: &str, seq: Option<u64>) {
        if let Some(earlier) = self.ended_push_at.remove(task_id) {
            self.ended_push.remove(&earlier);
        }
        let Some(seq) = seq else { return };
        self.ended_push.insert(seq, task_id.to_string());
        self.ended_push_at.insert(task_id.to_string(), seq);
        while self.ended_push.len() > KEPT_ENDED_PUSH {
            let Some((_, oldest)) = self.ended_push.pop_first() else { break };
            self.ended_push_at.remove(&oldest);
            for config in self.push.remove(&oldest).into_iter().flat_map(BTreeMap::into_values) {
                // Their files were given up when their task ended; any left go now.
                self.retired_secrets.extend(config.auth.references().cloned());
            }
        }
    }

    /// The reply to an unverified external sender, posted to its endpoint as its own A2A send
    /// does it: from the replying agent, naming the sender's task (`in_reply_to`).
    fn deliver_external_reply(
        &mut self,
        envelope: &Envelope,
        task_id: &str,
        from: &str,
        text: &str,
        reply: ExternalReply,
    ) {
        let mut metadata = json!({"sender": {"sender_id": from}, "response_mode": "silent"});
        if let Some(their_task) = &reply.task_id {
            metadata["in_reply_to"] = json!(their_task);
        }
        let body = json!({
            "message": {"role": "user", "parts": [{"type": "text", "text": text}]},
            "metadata": metadata,
        });
        let url = format!("{}/tasks/send", reply.endpoint.trim_end_matches('/'));
        let delivery_id = format!("{}-reply-{}", crate::event::short_id(task_id), envelope.seq);
        let owner = format!("reply:{task_id}");
        let delivery = Delivery::due(delivery_id, owner, &url, "task.replied", envelope.time_ms, body);
        self.pending.insert(delivery.delivery_id.clone(), delivery);
    }

    /// The retired secret files that nothing pending needs any more: forgotten here, for the
    /// worker to delete.
    pub fn take_unused_secrets(&mut self) -> Vec<String> {
        if self.retired_secrets.is_empty() {
            return Vec::new();
        }
        let mut in_use: std::collections::BTreeSet<&String> = std::collections::BTreeSet::new();
        in_use
            .extend(self.pending.values().filter_map(|delivery| delivery.push.as_ref()).flat_map(PushAuth::references));
        in_use.extend(self.push.values().flat_map(BTreeMap::values).flat_map(|config| config.auth.references()));
        in_use.extend(self.hooks.values().filter_map(|hook| match &hook.secret {
            Some(SecretSource::File(reference)) => Some(reference),
            _ => None,
        }));
        let unused: Vec<String> =
            self.retired_secrets.iter().filter(|reference| !in_use.contains(reference)).cloned().collect();
        for reference in &unused {
            self.retired_secrets.remove(reference);
        }
        unused
    }

    /// A retired secret file that could not be deleted: given again by the next
    /// [`Outbox::take_unused_secrets`] (and kept in the snapshot meanwhile).
    pub fn retire_again(&mut self, reference: String) {
        self.retired_secrets.insert(reference);
    }

    /// The push configs of a task, by config id.
    pub fn push_configs(&self, task_id: &str) -> Vec<PushConfig> {
        self.push.get(task_id).map(|configs| configs.values().cloned().collect()).unwrap_or_default()
    }

    pub fn hooks(&self) -> Vec<Hook> {
        self.hooks.values().cloned().collect()
    }

    pub fn hook(&self, url: &str) -> Option<&Hook> {
        self.hooks.get(url)
    }

    /// The URL a hook for `url` is registered under: `url` itself, or another spelling of the
    /// same target (hooks registered before URLs were normalised keep theirs).
    pub fn registered_spelling(&self, url: &str) -> Option<String> {
        if self.hooks.contains_key(url) {
            return Some(url.to_string());
        }
        let wanted = super::outbound::normalise_url(url.trim()).ok()?;
        self.hooks.keys().find(|stored| super::outbound::normalise_url(stored).is_ok_and(|one| one == wanted)).cloned()
    }

    /// The finished deliveries kept (oldest first), then the pending ones.
    pub fn each_delivery(&self) -> impl Iterator<Item = &Delivery> {
        self.finished.iter().chain(self.pending.values())
    }

    /// Every delivery, copied (tests; the API views them under the lock with `each_delivery`).
    #[cfg(test)]
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.each_delivery().cloned().collect()
    }

    /// The deliveries due at `now_ms` and not under way, the longest waiting first, at most
    /// `limit` of them (copied with their bodies: only as many as can start now).
    pub fn due(
        &self,
        now_ms: u64,
        in_flight: &HashSet<(String, u32)>,
        limit: usize,
    ) -> Vec<(Delivery, Option<SecretSource>)> {
        let mut due: Vec<&Delivery> = self
            .pending
            .values()
            .filter(|delivery| delivery.next_attempt_ms.is_some_and(|at| at <= now_ms))
            .filter(|delivery| !in_flight.contains(&(delivery.delivery_id.clone(), delivery.attempts)))
            .collect();
        due.sort_by_key(|delivery| delivery.next_attempt_ms);
        due.into_iter()
            .take(limit)
            .map(|delivery| {
                let secret = self
                    .hooks
                    .values()
                    .find(|hook| hook.webhook_id == delivery.webhook_id)
                    .and_then(|h| h.secret.clone());
                (delivery.clone(), secret)
            })
            .collect()
    }

    /// When the next attempt is due, of the deliveries not under way (`in_flight`).
    pub fn next_due(&self, in_flight: &HashSet<(String, u32)>) -> Option<u64> {
        self.pending
            .values()
            .filter(|delivery| !in_flight.contains(&(delivery.delivery_id.clone(), delivery.attempts)))
            .filter_map(|delivery| delivery.next_attempt_ms)
            .min()
    }
}

/// The broker's webhook state: the outbox and how far it has read the log.
pub struct Webhooks {
    pub outbox: Mutex<Outbox>,
    pub cursor: watch::Sender<u64>,
}

impl Default for Webhooks {
    fn default() -> Self {
        Webhooks { outbox: Mutex::new(Outbox::default()), cursor: watch::channel(0).0 }
    }
}

impl Webhooks {
    /// Is this attempt of this delivery still the one the outbox waits for?
    pub fn is_awaited(outbox: &Outbox, delivery_id: &str, attempts: u32) -> bool {
        outbox.pending.get(delivery_id).is_some_and(|delivery| delivery.attempts == attempts)
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until the outbox has applied the log up to `seq`, or the broker stops (`stop`: its
    /// shutdown signal; the delivery worker that moves the cursor ends then).
    pub async fn caught_up(&self, seq: u64, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut cursor = self.cursor.subscribe();
        tokio::select! {
            _ = cursor.wait_for(|cursor| *cursor >= seq) => {}
            _ = stop.wait_for(|stopping| *stopping) => {}
        }
    }
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`: the `x-synapse-signature` of a delivery.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    // HMAC takes keys of any length (a long one is hashed first): this cannot fail.
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn retry_base_ms() -> u64 {
    std::env::var("SYNAPSE_WEBHOOK_RETRY_BASE_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(1000)
}

/// What one attempt got: the status, and a note when the answer's body was cut at the cap.
pub type PostResult = Result<(u16, Option<String>), String>;

/// The outcome of an attempt as the event to record.
pub fn record(delivery: &Delivery, result: PostResult, now_ms: u64) -> Attempt {
    let attempt = delivery.attempts + 1;
    let retry = match &result {
        Ok((status, _)) => *status >= 500,
        Err(_) => true,
    };
    let next_attempt_ms = (retry && attempt < MAX_ATTEMPTS)
        .then(|| now_ms + retry_base_ms().saturating_mul(1u64 << (attempt - 1).min(20)));
    let (status, error) = match result {
        Ok((status, note)) => (Some(status), note),
        Err(error) => (None, Some(error)),
    };
    let error = match (&error, next_attempt_ms, retry) {
        (_, None, true) => Some(format!("gave up after {attempt} attempts: {}", error.unwrap_or_default())),
        _ => error,
    };
    Attempt {
        delivery_id: delivery.delivery_id.clone(),
        webhook_id: delivery.webhook_id.clone(),
        event: delivery.event.clone(),
        attempt,
        status,
        error,
        next_attempt_ms,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A message of an unverified sender that gave an endpoint; with a sender's task when it
    /// expects a reply.
    pub(crate) fn from_outside(task_id: &str, sender_task_id: Option<&str>) -> Event {
        Event::MessageSent {
            task_id: task_id.into(),
            from: None,
            to: "bob".into(),
            priority: 3,
            response_expected: sender_task_id.is_some(),
            sender_task_id: sender_task_id.map(str::to_string),
            in_reply_to: None,
            text: "from far away".into(),
            parts: vec![],
            idempotency_key: None,
            by_user: false,
            unverified_sender: Some("far".into()),
            sender_endpoint: Some("http://127.0.0.1:9/".into()),
            external_task_id: Some(format!("theirs-{task_id}")),
        }
    }

    pub(crate) fn state_changed(task_id: &str, state: TaskState) -> Event {
        Event::TaskStateChanged {
            task_id: task_id.into(),
            state,
            artifacts: vec![],
            error: None,
            reply_of: None,
            as_message: false,
        }
    }

    /// A client's push config `c` for `task_id`, with a token file.
    fn push_config_set(task_id: &str, token_ref: &str, task_ended: bool) -> Event {
        Event::PushConfigSet {
            task_id: task_id.into(),
            config_id: "c".into(),
            context_id: "ctx".into(),
            url: "http://127.0.0.1:3/".into(),
            token_ref: Some(token_ref.into()),
            auth_scheme: None,
            credentials_ref: None,
            task_ended,
        }
    }

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        assert_eq!(
            crate::secret::to_hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn urls_must_be_plain_http_with_a_host() {
        assert_eq!(parse_url("http://127.0.0.1:9000/hook").unwrap(), ("127.0.0.1".into(), 9000, "/hook".into()));
        assert_eq!(parse_url("http://example.test").unwrap(), ("example.test".into(), 80, "/".into()));
        assert!(parse_url("https://example.test/").is_err());
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http://:80/").is_err());
        assert!(parse_url("http://host:notaport/").is_err());
    }

    fn envelope(seq: u64, event: Event) -> Envelope {
        Envelope { v: 1, seq, time_ms: 1000 + seq, actor: None, event }
    }

    #[test]
    fn the_outbox_follows_registrations_task_events_and_attempts() {
        let mut outbox = Outbox::default();
        outbox.apply(&envelope(
            1,
            Event::WebhookRegistered {
                webhook_id: "abcdef12-0000".into(),
                url: "http://127.0.0.1:1/".into(),
                events: vec!["task.completed".into()],
                secret: None,
                secret_ref: None,
            },
        ));
        outbox.apply(&envelope(
            2,
            Event::TaskStateChanged {
                task_id: "t".into(),
                state: TaskState::Working,
                artifacts: vec![],
                error: None,
                reply_of: None,
                as_message: false,
            },
        ));
        assert!(outbox.deliveries().is_empty(), "working is not a webhook event");
        outbox.apply(&envelope(
            3,
            Event::TaskStateChanged {
                task_id: "t".into(),
                state: TaskState::Completed,
                artifacts: vec![],
                error: None,
                reply_of: None,
                as_message: false,
            },
        ));
        outbox.apply(&envelope(4, Event::TaskCanceled { task_id: "u".into(), reason: None, by: None }));
        let deliveries = outbox.deliveries();
        assert_eq!(deliveries.len(), 1, "only subscribed events");
        assert_eq!(deliveries[0].delivery_id, "abcdef12-3");
        assert!(outbox.due(5000, &HashSet::new(), 0).is_empty(), "no free slot: nothing is copied");
        let due = outbox.due(5000, &HashSet::new(), usize::MAX);
        assert_eq!(due.len(), 1);
        let retry = record(&due[0].0, Ok((503, None)), 5000);
        assert_eq!(retry.attempt, 1);
        assert!(retry.next_attempt_ms.is_some());
        outbox.apply(&envelope(5, event_of(&WebhookCommand::RecordAttempt(retry), false).ok().unwrap()));
        assert_eq!(outbox.deliveries()[0].state, "pending");
        assert!(!outbox.deliveries()[0].body.is_empty(), "kept while it may be sent again");
        let done = record(&outbox.deliveries()[0], Ok((200, None)), 6000);
        assert!(done.next_attempt_ms.is_none());
        outbox.apply(&envelope(6, event_of(&WebhookCommand::RecordAttempt(done), false).ok().unwrap()));
        assert_eq!(outbox.deliveries()[0].state, "delivered");
        assert_eq!(outbox.deliveries()[0].body, "", "a finished delivery keeps no body");
        assert!(outbox.due(u64::MAX, &HashSet::new(), usize::MAX).is_empty());
    }

    #[tokio::test]
    async fn a_wait_for_the_outbox_ends_when_it_catches_up_or_when_the_broker_stops() {
        let webhooks = std::sync::Arc::new(Webhooks::default());
        let (stop, stopping) = tokio::sync::watch::channel(false);

        let waiting = tokio::spawn({
            let (webhooks, stopping) = (webhooks.clone(), stopping.clone());
            async move { webhooks.caught_up(5, stopping).await }
        });
        webhooks.cursor.send_replace(4);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the outbox has not reached 5 yet");
        webhooks.cursor.send_replace(5);
        waiting.await.unwrap();

        // The cursor never reaches 100: the stop ends the wait (the worker that moves it has ended).
        let waiting = tokio::spawn({
            let webhooks = webhooks.clone();
            async move { webhooks.caught_up(100, stopping).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        stop.send_replace(true);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(30), waiting).await;
        assert!(ended.is_ok(), "the wait must end when the broker stops");
    }

    /// An unverified sender's message waits for its reply only while one can come: the reply
    /// is delivered once; a message that expects none, or whose sender's task ended without
    /// one, leaves nothing behind.
    #[test]
    fn an_outside_message_waits_for_its_reply_only_while_one_can_come() {
        let reply = |task_id: &str, sender_task_id: &str| Event::ReplyPosted {
            task_id: task_id.into(),
            sender_task_id: Some(sender_task_id.into()),
            from: "bob".into(),
            to: None,
            text: "back to you".into(),
            idempotency_key: None,
        };
        let waiting = |outbox: &Outbox| (outbox.external_replies.len(), outbox.external_reply_senders.len());
        let mut outbox = Outbox::default();
        let events = [
            from_outside("silent", None),
            from_outside("answered", Some("answered-s")),
            from_outside("canceled", Some("canceled-s")),
            from_outside("failed", Some("failed-s")),
            from_outside("open", Some("open-s")),
        ];
        for (at, event) in events.into_iter().enumerate() {
            outbox.apply(&envelope(at as u64 + 1, event));
        }
        assert_eq!(waiting(&outbox), (4, 4), "the silent message waits for nothing");
        // The order of `decide_reply`: the reply, then the sender's task completes.
        outbox.apply(&envelope(10, reply("answered", "answered-s")));
        outbox.apply(&envelope(11, state_changed("answered-s", TaskState::Completed)));
        outbox.apply(&envelope(12, Event::TaskCanceled { task_id: "canceled-s".into(), reason: None, by: None }));
        outbox.apply(&envelope(13, state_changed("failed-s", TaskState::Failed)));
        // The receiver's side ending does not end the wait: the broker still takes a reply.
        outbox.apply(&envelope(14, state_changed("open", TaskState::Completed)));
        outbox.apply(&envelope(15, state_changed("open-s", TaskState::Working)));
        assert_eq!(waiting(&outbox), (1, 1));
        assert!(outbox.external_replies.contains_key("open"));
        let replies: Vec<Delivery> =
            outbox.deliveries().into_iter().filter(|delivery| delivery.event == "task.replied").collect();
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].url, "http://127.0.0.1:9/tasks/send");
        let body: Value = serde_json::from_str(&replies[0].body).unwrap();
        assert_eq!(body["metadata"]["in_reply_to"], "theirs-answered");
        // A second reply to the answered message (refused by the broker anyway) sends nothing.
        outbox.apply(&envelope(16, reply("answered", "answered-s")));
        outbox.apply(&envelope(17, reply("open", "open-s")));
        assert_eq!(waiting(&outbox), (0, 0));
        assert_eq!(outbox.deliveries().iter().filter(|delivery| delivery.event == "task.replied").count(), 2);
    }

    /// The configs of tasks that ended stay listed for the last `KEPT_ENDED_PUSH` of them; a
    /// task that goes on after a final state keeps its configs; the forgotten ones' last
    /// notifications are still delivered.
    #[test]
    fn the_push_configs_of_the_tasks_that_ended_longest_ago_are_forgotten() {
        let set = |task_id: &str| push_config_set(task_id, &format!("token-{task_id}"), false);
        let mut outbox = Outbox::default();
        let mut seq = 0;
        let mut apply = |outbox: &mut Outbox, event: Event| {
            seq += 1;
            outbox.apply(&envelope(seq, event));
        };
        apply(&mut outbox, set("goes-on"));
        apply(&mut outbox, state_changed("goes-on", TaskState::Completed));
        apply(&mut outbox, state_changed("goes-on", TaskState::Working));
        apply(&mut outbox, set("open"));
        for n in 0..KEPT_ENDED_PUSH + 2 {
            let task = format!("p{n}");
            apply(&mut outbox, set(&task));
            apply(&mut outbox, state_changed(&task, TaskState::Completed));
        }
        assert!(outbox.push_configs("p0").is_empty());
        assert!(outbox.push_configs("p1").is_empty());
        assert_eq!(outbox.push_configs("p2").len(), 1);
        assert_eq!(outbox.push_configs(&format!("p{}", KEPT_ENDED_PUSH + 1)).len(), 1);
        assert_eq!(outbox.push_configs("goes-on").len(), 1, "a task that went on is not one that ended");
        assert_eq!(outbox.push_configs("open").len(), 1);
        assert_eq!(outbox.push.len(), KEPT_ENDED_PUSH + 2);
        assert_eq!((outbox.ended_push.len(), outbox.ended_push_at.len()), (KEPT_ENDED_PUSH, KEPT_ENDED_PUSH));
        // p0's completion notification is still pending, with its token.
        let p0 = outbox.deliveries().into_iter().find(|delivery| delivery.webhook_id == "push:p0:c").unwrap();
        assert_eq!(p0.push.and_then(|auth| auth.token_ref).as_deref(), Some("token-p0"));
        // Deleting the last config of a task that ended takes it out of the count.
        outbox.apply(&envelope(100_000, Event::PushConfigDeleted { task_id: "p2".into(), config_id: "c".into() }));
        assert_eq!(outbox.ended_push.len(), KEPT_ENDED_PUSH - 1);
        assert!(!outbox.ended_push_at.contains_key("p2"));
    }

    /// A config set on a task that had ended gets no notification: its secret goes at once and
    /// it counts among the configs of tasks that ended (it would be kept for good otherwise). A
    /// config that replaces another gives up the other's secret.
    #[test]
    fn a_config_set_after_its_task_ended_or_replaced_gives_up_its_secret() {
        let mut outbox = Outbox::default();
        outbox.apply(&envelope(1, push_config_set("open", "token-1", false)));
        outbox.apply(&envelope(2, push_config_set("open", "token-2", false)));
        assert_eq!(outbox.take_unused_secrets(), ["token-1"]);
        assert_eq!(outbox.push_configs("open")[0].auth.token_ref.as_deref(), Some("token-2"));
        // The same reference again is not given up.
        outbox.apply(&envelope(3, push_config_set("open", "token-2", false)));
        assert!(outbox.take_unused_secrets().is_empty());

        outbox.apply(&envelope(4, push_config_set("late", "token-late", true)));
        assert_eq!(outbox.take_unused_secrets(), ["token-late"]);
        assert_eq!(outbox.push_configs("late").len(), 1, "still listed");
        assert_eq!(outbox.ended_push_at.get("late"), Some(&4));
        assert!(outbox.deliveries().is_empty());
        for n in 0..KEPT_ENDED_PUSH {
            let task = format!("p{n}");
            let seq = 10 + 2 * n as u64;
            outbox.apply(&envelope(seq, push_config_set(&task, &format!("token-{n}"), false)));
            outbox.apply(&envelope(seq + 1, state_changed(&task, TaskState::Completed)));
        }
        assert!(outbox.push_configs("late").is_empty(), "forgotten with the tasks that ended first");
        assert_eq!(outbox.push_configs("open").len(), 1);
    }

    /// The same URL registered again: its pending delivery goes on under the new registration
    /// (with its secret, and dropped by its removal), the old secret's file goes; the next
    /// attempt due is that of a delivery not under way.
    #[test]
    fn a_url_registered_again_takes_over_the_pending_deliveries_and_gives_up_the_old_secret() {
        let register = |webhook_id: &str, secret_ref: &str| Event::WebhookRegistered {
            webhook_id: webhook_id.into(),
            url: "http://127.0.0.1:1/".into(),
            events: vec!["task.completed".into()],
            secret: None,
            secret_ref: Some(secret_ref.into()),
        };
        let mut outbox = Outbox::default();
        outbox.apply(&envelope(1, register("11111111-0000", "secret-1")));
        outbox.apply(&envelope(2, state_changed("t", TaskState::Completed)));
        let pending = outbox.deliveries();
        assert_eq!(pending.len(), 1);
        let under_way = HashSet::from([(pending[0].delivery_id.clone(), 0)]);
        assert_eq!(outbox.next_due(&HashSet::new()), pending[0].next_attempt_ms);
        assert_eq!(outbox.next_due(&under_way), None, "the only delivery is under way");

        outbox.apply(&envelope(3, register("22222222-0000", "secret-2")));
        assert_eq!(outbox.take_unused_secrets(), ["secret-1"]);
        let due = outbox.due(u64::MAX, &HashSet::new(), usize::MAX);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].0.webhook_id, "22222222-0000");
        assert!(matches!(&due[0].1, Some(SecretSource::File(reference)) if reference == "secret-2"));
        // The same secret file again is not given up.
        outbox.apply(&envelope(4, register("33333333-0000", "secret-2")));
        assert!(outbox.take_unused_secrets().is_empty());
        outbox.apply(&envelope(
            5,
            Event::WebhookRemoved { webhook_id: String::new(), url: "http://127.0.0.1:1/".into() },
        ));
        assert!(outbox.deliveries().is_empty(), "the removal drops the delivery it took over");
        assert_eq!(outbox.take_unused_secrets(), ["secret-2"]);
    }

    #[test]
    fn client_errors_are_not_retried_and_retries_give_up() {
        let delivery = Delivery {
            delivery_id: "d".into(),
            webhook_id: "w".into(),
            url: "http://127.0.0.1:1/".into(),
            event: "task.completed".into(),
            state: "pending".into(),
            attempts: 0,
            last_status: None,
            last_error: None,
            next_attempt_ms: Some(0),
            body: "{}".into(),
            push: None,
        };
        assert!(record(&delivery, Ok((404, None)), 0).next_attempt_ms.is_none());
        assert!(record(&delivery, Err("refused".into()), 0).next_attempt_ms.is_some());
        let last = Delivery { attempts: MAX_ATTEMPTS - 1, ..delivery };
        let gave_up = record(&last, Err("refused".into()), 0);
        assert!(gave_up.next_attempt_ms.is_none());
        assert!(gave_up.error.unwrap().contains("gave up"));
    }
}
