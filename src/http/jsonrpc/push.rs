//! Push notification configs (A2A: `CreateTaskPushNotificationConfig`, `Get...`, `List...`,
//! `Delete...`, and `configuration.taskPushNotificationConfig` of a send), in both versions'
//! shapes; the HTTP+JSON binding calls the same functions.
//!
//! Invariants: a config belongs to a task of this agent that the client can see (the task is
//! looked up as `GetTask` does); its URL passes the webhook URL rules (parsed here, then the
//! broker's outbound policy: no private targets unless the home allows them, never the broker
//! itself), checked again at every attempt; its token and credentials are written to files
//! (`webhooks::store_secret`) before the event that refers to them is appended, and are never
//! answered back. Deliveries are the webhook outbox's, so they are retried and survive restarts.

use super::params::{find_task, string_param};
use super::{INTERNAL_ERROR, RpcError, TASK_NOT_FOUND, Version};
use crate::broker::command::{Actor, Command, Outcome, check_party, sent_by_user_with};
use crate::broker::webhooks::{self, PushAuth, PushConfig, WebhookCommand};
use crate::http::AppState;
use crate::store::TaskRecord;
use serde_json::{Value, json};

/// Longest token or credentials a client may give (they travel in a header).
const MAX_SECRET_BYTES: usize = 4096;

/// A config as a client gives it, in either version's shape.
#[derive(Clone)]
pub(super) struct ConfigRequest {
    config_id: Option<String>,
    url: String,
    token: Option<String>,
    scheme: Option<String>,
    credentials: Option<String>,
}

impl ConfigRequest {
    pub(super) fn url(&self) -> &str {
        &self.url
    }
    pub(super) fn config_id(&self) -> Option<&str> {
        self.config_id.as_deref()
    }
}

/// A header value may hold visible ASCII and spaces only (no line break can add a header).
fn header_safe(name: &str, text: &str) -> Result<(), RpcError> {
    if text.len() > MAX_SECRET_BYTES || !text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err(RpcError::params(format!(
            "'{name}' must be at most {MAX_SECRET_BYTES} visible ASCII characters (it is sent in a header)"
        )));
    }
    Ok(())
}

/// The config object of a request: v1.0's `TaskPushNotificationConfig` (flat) or 0.3's
/// `PushNotificationConfig` (`authentication.schemes`).
pub(super) fn parse_config(version: Version, config: &Value) -> Result<ConfigRequest, RpcError> {
    if !config.is_object() {
        return Err(RpcError::params("the push notification config must be an object"));
    }
    let url = string_param(config, "url")?
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .ok_or_else(|| RpcError::params("'url' is required"))?
        .to_string();
    let config_id = string_param(config, "id")?.filter(|id| !id.is_empty()).map(str::to_string);
    if let Some(id) = &config_id
        && !webhooks::is_valid_config_id(id)
    {
        return Err(RpcError::params(format!("'id' must be 1-64 letters, digits, '-', '_' or '.' (got '{id}')")));
    }
    let token = string_param(config, "token")?.filter(|token| !token.is_empty()).map(str::to_string);
    if let Some(token) = &token {
        header_safe("token", token)?;
    }
    let (scheme, credentials) = match config.get("authentication").filter(|auth| !auth.is_null()) {
        None => (None, None),
        Some(auth) if !auth.is_object() => return Err(RpcError::params("'authentication' must be an object")),
        Some(auth) => {
            let scheme = match version {
                Version::V10 => string_param(auth, "scheme")?.map(str::to_string),
                Version::V03 => auth
                    .get("schemes")
                    .and_then(Value::as_array)
                    .and_then(|schemes| schemes.first())
                    .and_then(Value::as_str)
                    .map(str::to_string),
            };
            let credentials = string_param(auth, "credentials")?.filter(|c| !c.is_empty()).map(str::to_string);
            (scheme.filter(|scheme| !scheme.is_empty()), credentials)
        }
    };
    if let Some(scheme) = &scheme
        && (scheme.len() > 64 || !scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+.^_`|~-".contains(&b)))
    {
        return Err(RpcError::params(format!("'authentication.scheme' is not an HTTP auth scheme: '{scheme}'")));
    }
    if let Some(credentials) = &credentials {
        header_safe("authentication.credentials", credentials)?;
    }
    if credentials.is_some() && scheme.is_none() {
        return Err(RpcError::params("'authentication.credentials' needs a 'scheme' (Bearer, Basic, ...)"));
    }
    Ok(ConfigRequest { config_id, url, token, scheme, credentials })
}

fn store_secret(state: &AppState, secret: &Option<String>) -> Result<Option<String>, RpcError> {
    secret
        .as_ref()
        .map(|secret| {
            webhooks::store_secret(&state.paths.home, secret).map_err(|error| {
                RpcError::new(INTERNAL_ERROR, format!("cannot store the push notification secret: {error}"))
            })
        })
        .transpose()
}

async fn appended(state: &AppState, command: WebhookCommand) -> Result<(), RpcError> {
    match state.writer.submit(Command::Webhook(command)).await? {
        Outcome::Appended { seq } => {
            state.webhooks.caught_up(seq, state.shutdown.subscribe()).await;
            Ok(())
        }
        _ => Err(RpcError::new(INTERNAL_ERROR, "unexpected answer from the writer")),
    }
}

/// The webhook URL rules: refused now rather than at every delivery (each attempt checks
/// again, on the address it connects to).
pub(super) async fn check_url(state: &AppState, url: &str) -> Result<(), RpcError> {
    crate::broker::webhooks::parse_url(url)
        .map_err(|message| RpcError::params(format!("Invalid push notification URL {message}")))?;
    state
        .outbound_policy()
        .check_url(url)
        .await
        .map_err(|reason| RpcError::params(format!("push notification URL {url} refused: {reason}")))
}

/// Refuses a new config for task `task_id` that has [`MAX_CONFIGS_PER_TASK`] already (each is
/// one more POST at every change of the task: a few per task, not thousands). A config that
/// replaces one of them (same `config_id`) is not new.
pub(super) async fn check_room(state: &AppState, task_id: &str, config_id: Option<&str>) -> Result<(), RpcError> {
    state.delivery_current().await;
    let configs = state.webhooks.lock().push_configs(task_id);
    let replaces = config_id.is_some_and(|id| configs.iter().any(|config| config.config_id == id));
    if !replaces && configs.len() >= MAX_CONFIGS_PER_TASK {
        return Err(RpcError::params(format!(
            "task {task_id} has {MAX_CONFIGS_PER_TASK} push notification configs already: delete one first"
        )));
    }
    Ok(())
}

/// Sets a config on `task` (a task of this agent); returns it as the client sees it.
pub(super) async fn set_config(
    state: &AppState,
    version: Version,
    task: &TaskRecord,
    request: ConfigRequest,
) -> Result<Value, RpcError> {
    check_url(state, &request.url).await?;
    // Counted and appended in one turn (check_room waits for the worker to apply the log up to
    // the head): two configs set at once cannot both take the last place.
    let _turn = state.push_config_turn.lock().await;
    check_room(state, &task.id, request.config_id.as_deref()).await?;
    let config = PushConfig {
        task_id: task.id.clone(),
        config_id: request.config_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        context_id: task.context_id.clone(),
        url: request.url,
        auth: PushAuth {
            token_ref: store_secret(state, &request.token)?,
            scheme: request.scheme,
            credentials_ref: store_secret(state, &request.credentials)?,
        },
    };
    let shown = config_json(version, &config);
    let secrets: Vec<String> =
        [&config.auth.token_ref, &config.auth.credentials_ref].into_iter().flatten().cloned().collect();
    if let Err(error) = appended(state, WebhookCommand::SetPushConfig(config)).await {
        // Refused by the writer: no event names the secret files, nothing else deletes them.
        if error.code != INTERNAL_ERROR {
            for reference in &secrets {
                crate::broker::webhooks::delete_secret(&state.paths.home, reference);
            }
        }
        return Err(error);
    }
    Ok(shown)
}

/// Push notification configs one task may have.
const MAX_CONFIGS_PER_TASK: usize = 10;

/// A config as the client sees it: never its token or credentials.
fn config_json(version: Version, config: &PushConfig) -> Value {
    match version {
        Version::V10 => {
            let mut shown = json!({"taskId": config.task_id, "id": config.config_id, "url": config.url});
            if let Some(scheme) = &config.auth.scheme {
                shown["authentication"] = json!({"scheme": scheme});
            }
            shown
        }
        Version::V03 => {
            let mut inner = json!({"id": config.config_id, "url": config.url});
            if let Some(scheme) = &config.auth.scheme {
                inner["authentication"] = json!({"schemes": [scheme]});
            }
            json!({"taskId": config.task_id, "pushNotificationConfig": inner})
        }
    }
}

/// The task a request names: `taskId` (v1.0) or `id` (0.3, and v1.0's REST path).
fn task_of(
    state: &AppState,
    agent: &str,
    actor: &Actor,
    version: Version,
    params: &Value,
) -> Result<TaskRecord, RpcError> {
    let names: &[&str] = match version {
        Version::V10 => &["taskId", "id"],
        Version::V03 => &["id", "taskId"],
    };
    let mut reference = None;
    for name in names {
        if let Some(value) = string_param(params, name)?.filter(|value| !value.is_empty()) {
            reference = Some(value);
            break;
        }
    }
    let reference = reference.ok_or_else(|| RpcError::params("'taskId' (the task id) is required"))?;
    let task = find_task(state, agent, reference)?;
    // Whoever may cancel the task may see and change where its changes are pushed; nobody
    // else (a client of its own, or another agent, redirecting or removing the user's).
    let by_user = state.store.read(|view| {
        sent_by_user_with(&task, |peer| Ok(view.tasks_with_prefix(peer, 1)?.into_iter().find(|task| task.id == peer)))
    })?;
    check_party(&task, by_user, actor, "has push notification configs set, read or deleted")?;
    Ok(task)
}

/// The config id a get or delete names: `id` (v1.0, beside `taskId`) or
/// `pushNotificationConfigId` (0.3).
fn config_id_of(version: Version, params: &Value) -> Result<Option<String>, RpcError> {
    let name = match version {
        Version::V10 => "id",
        Version::V03 => "pushNotificationConfigId",
    };
    Ok(string_param(params, name)?.filter(|id| !id.is_empty()).map(str::to_string))
}

fn config_not_found(task_id: &str, config_id: &str) -> RpcError {
    RpcError::new(TASK_NOT_FOUND, format!("Push notification config '{config_id}' of task {task_id} not found"))
        .with("taskId", task_id.to_string())
}

/// `CreateTaskPushNotificationConfig` / `tasks/pushNotificationConfig/set`.
pub(super) async fn create(
    state: &AppState,
    agent: &str,
    actor: &Actor,
    version: Version,
    params: &Value,
) -> Result<Value, RpcError> {
    let task = task_of(state, agent, actor, version, params)?;
    let config = match version {
        Version::V10 => params,
        Version::V03 => params
            .get("pushNotificationConfig")
            .ok_or_else(|| RpcError::params("'pushNotificationConfig' is required"))?,
    };
    let request = parse_config(version, config)?;
    set_config(state, version, &task, request).await
}

/// `GetTaskPushNotificationConfig` / `tasks/pushNotificationConfig/get` (0.3: without an id,
/// the task's only or first config).
pub(super) async fn get(
    state: &AppState,
    agent: &str,
    actor: &Actor,
    version: Version,
    params: &Value,
) -> Result<Value, RpcError> {
    let task = task_of(state, agent, actor, version, params)?;
    state.delivery_current().await;
    let configs = state.webhooks.lock().push_configs(&task.id);
    let config = match config_id_of(version, params)? {
        Some(id) => {
            configs.into_iter().find(|config| config.config_id == id).ok_or_else(|| config_not_found(&task.id, &id))
        }
        None if version == Version::V03 => {
            configs.into_iter().next().ok_or_else(|| config_not_found(&task.id, "(any)"))
        }
        None => Err(RpcError::params("'id' (the config id) is required")),
    }?;
    Ok(config_json(version, &config))
}

/// `ListTaskPushNotificationConfigs` / `tasks/pushNotificationConfig/list`.
pub(super) async fn list(
    state: &AppState,
    agent: &str,
    actor: &Actor,
    version: Version,
    params: &Value,
) -> Result<Value, RpcError> {
    let task = task_of(state, agent, actor, version, params)?;
    state.delivery_current().await;
    let configs: Vec<Value> =
        state.webhooks.lock().push_configs(&task.id).iter().map(|config| config_json(version, config)).collect();
    Ok(match version {
        Version::V10 => json!({"configs": configs, "nextPageToken": ""}),
        Version::V03 => Value::Array(configs),
    })
}

/// `DeleteTaskPushNotificationConfig` / `tasks/pushNotificationConfig/delete`: idempotent (a
/// config already gone is no error).
pub(super) async fn delete(
    state: &AppState,
    agent: &str,
    actor: &Actor,
    version: Version,
    params: &Value,
) -> Result<Value, RpcError> {
    let task = task_of(state, agent, actor, version, params)?;
    let config_id = config_id_of(version, params)?.ok_or_else(|| RpcError::params("the config id is required"))?;
    state.delivery_current().await;
    let known = state.webhooks.lock().push_configs(&task.id).iter().any(|config| config.config_id == config_id);
    if known {
        appended(state, WebhookCommand::DeletePushConfig { task_id: task.id.clone(), config_id }).await?;
    }
    Ok(Value::Null)
}
