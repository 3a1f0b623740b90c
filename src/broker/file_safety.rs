//! File safety (SPEC §5): locks and modification records, decided in the writer so that two
//! agents racing for one file get exactly one winner.
//!
//! A lock is free once its expiry has passed or its holder is no longer registered. Both are
//! decided against the batch's explicit `now`; the projection only stores what happened.

use super::command::decision::{Answer, CommandError, Context, DecideError, Decision};
use crate::event::{ChangeType, Event};
use crate::store::{FileLock, Projections, StoreError};

/// Default lock duration (SPEC §5).
pub const LOCK_DEFAULT_DURATION_SECONDS: u64 = 300;
/// Longest lock one request may take.
pub const LOCK_MAX_DURATION_SECONDS: u64 = 7 * 24 * 3600;

#[derive(Debug, Clone)]
pub enum FileCommand {
    Lock {
        path: String,
        /// Other names of the same file that a lock may be kept under ([`aliases`]): such a
        /// lock binds too.
        aliases: Vec<String>,
        agent_id: String,
        duration_seconds: u64,
        intent: Option<String>,
        task_id: Option<String>,
    },
    Unlock {
        path: String,
        agent_id: Option<String>,
        force: bool,
        /// The user asked (not an agent): may force-release any lock. An agent may force only
        /// a lock whose holder's time ran out or whose holder is gone.
        by_user: bool,
    },
    Record {
        path: String,
        agent_id: String,
        task_id: String,
        change_type: ChangeType,
        intent: Option<String>,
    },
    /// Releases expired locks and locks of agents that are gone, and drops modification
    /// records older than `keep_days` days.
    Cleanup {
        keep_days: Option<u64>,
    },
}

impl FileCommand {
    /// Does deciding this command read whether a lock's holder still runs? Only an agent's
    /// forced unlock does (see [`decide`]).
    pub fn reads_liveness(&self) -> bool {
        matches!(self, FileCommand::Unlock { force: true, by_user: false, .. })
    }
}

pub use crate::api::normalize;

/// The path a lock is about, as the kernel reads it: symlinks resolved in the longest part of it
/// that exists (the file itself may not exist yet), so a link to a locked file names the locked
/// file; the rest [`normalize`]d. Resolved from the path as given: a `..` after a symlink leaves
/// the link's target, not the directory the link is in, which text alone would say (two names
/// for one file, two locks). Done where the request arrives, not in the writer, which reads no
/// file system.
pub fn canonical(path: &str) -> Result<String, String> {
    // Refuses what is not a path (relative, control characters, too long) before anything is
    // looked up.
    crate::api::check_length(path)?;
    let normalized = normalize(path)?;
    let components: Vec<std::path::Component<'_>> = std::path::Path::new(path).components().collect();
    let resolve = |count: usize| std::fs::canonicalize(components[..count].iter().collect::<std::path::PathBuf>());
    // The parts that exist are a leading run (the kernel reaches a part only through every part
    // before it), so the longest that resolves is found by halving: a few look-ups, not one per
    // part of a path of many missing parts. The whole path first (it usually exists), then all
    // but its last part (a file not made yet).
    let (mut low, mut high) = (1, components.len());
    let mut probe = high;
    let mut longest = None;
    while low <= high {
        match resolve(probe) {
            Ok(real) => {
                longest = Some((probe, real));
                low = probe + 1;
            }
            Err(_) => high = probe - 1,
        }
        probe = if high + 1 == components.len() { high } else { low + high.saturating_sub(low).div_ceil(2) };
    }
    let Some((existing, mut real)) = longest else {
        return Ok(normalized);
    };
    for part in &components[existing..] {
        match part {
            std::path::Component::ParentDir => {
                real.pop();
            }
            std::path::Component::Normal(name) => real.push(name),
            _ => {}
        }
    }
    let real = real.to_str().ok_or_else(|| format!("'{normalized}' resolves to a path that is not UTF-8"))?;
    normalize(real)
}

/// The other names a lock on the file `raw` resolves to ([`canonical`], `resolved`) may be
/// kept under: the path as written ([`normalize`]d), and the paths of `locks` held now, when
/// they resolve to the same file. A lock taken before a link on its way existed (a directory
/// not made yet) was kept under the name it resolved to then; once the link is there, that
/// name resolves elsewhere, and the lock must still bind, and be released by the path `locks`
/// prints. A written path that is another file (`link/../x`, which the kernel reads from the
/// link's target) is not a name of this one. Only locks on a file of the same name are
/// resolved (a link on the way keeps it).
pub fn aliases(raw: &str, resolved: &str, locks: impl IntoIterator<Item = String>) -> Vec<String> {
    let file_name = std::path::Path::new(resolved).file_name();
    let same_file = |path: &str| {
        path != resolved
            && std::path::Path::new(path).file_name() == file_name
            && canonical(path).is_ok_and(|again| again == resolved)
    };
    let mut aliases: Vec<String> = normalize(raw).into_iter().filter(|written| same_file(written)).collect();
    for path in locks {
        if !aliases.contains(&path) && same_file(&path) {
            aliases.push(path);
        }
    }
    aliases
}

/// Why `agent` may or may not write `path` now: (allowed, reason, the lock in force).
pub fn may_write(
    view_lock: Option<FileLock>,
    holder_registered: impl Fn(&str) -> bool,
    agent: &str,
    now_ms: u64,
) -> (bool, String, Option<FileLock>) {
    match view_lock {
        None => (true, "the file is not locked".into(), None),
        Some(lock) if lock.expires_ms <= now_ms => (true, format!("the lock of {} expired", lock.agent_id), None),
        Some(lock) if !holder_registered(&lock.agent_id) => {
            (true, format!("the lock holder {} is gone", lock.agent_id), None)
        }
        Some(lock) if lock.agent_id == agent => (true, "you hold the lock".into(), Some(lock)),
        Some(lock) => (
            false,
            format!("File is already locked by {} until {}", lock.agent_id, crate::time::rfc3339(lock.expires_ms)),
            Some(lock),
        ),
    }
}

fn registered<'a>(view: &'a Projections<'a>) -> impl Fn(&str) -> bool + 'a {
    move |agent: &str| view.agent_exists(agent).unwrap_or(false)
}

fn require_agent(view: &Projections<'_>, agent: &str) -> Result<(), DecideError> {
    if !view.agent_exists(agent)? {
        return Err(CommandError::not_found(format!("Agent '{agent}' is not registered")).into());
    }
    Ok(())
}

pub fn decide(view: &Projections<'_>, command: &FileCommand, context: &Context<'_>) -> Result<Decision, DecideError> {
    let now_ms = context.now_ms;
    let decision = |actor: Option<&str>, events: Vec<Event>| {
        Ok(Decision { actor: actor.map(str::to_string), events, answer: Answer::Appended })
    };
    match command {
        FileCommand::Lock { path, aliases, agent_id, duration_seconds, intent, task_id } => {
            let path = normalize(path).map_err(CommandError::bad)?;
            if *duration_seconds == 0 || *duration_seconds > LOCK_MAX_DURATION_SECONDS {
                return Err(CommandError::bad(format!(
                    "the duration must be between 1 and {LOCK_MAX_DURATION_SECONDS} seconds (got {duration_seconds})"
                ))
                .into());
            }
            require_agent(view, agent_id)?;
            for alias in aliases {
                let alias = normalize(alias).map_err(CommandError::bad)?;
                let (allowed, reason, _) = may_write(view.lock(&alias)?, registered(view), agent_id, now_ms);
                if !allowed {
                    return Err(CommandError::conflict(format!("{reason} (as {alias})")).into());
                }
            }
            let (allowed, reason, held) = may_write(view.lock(&path)?, registered(view), agent_id, now_ms);
            if !allowed {
                return Err(CommandError::conflict(reason).into());
            }
            // A renewal keeps the intent and task it does not restate.
            let (intent, task_id) = match held {
                Some(lock) => (intent.clone().or(lock.intent), task_id.clone().or(lock.task_id)),
                None => (intent.clone(), task_id.clone()),
            };
            decision(
                Some(agent_id),
                vec![Event::FileLockAcquired {
                    path,
                    agent_id: agent_id.clone(),
                    expires_ms: now_ms + duration_seconds * 1000,
                    intent,
                    task_id,
                }],
            )
        }
        FileCommand::Unlock { path, agent_id, force, by_user } => {
            let path = normalize(path).map_err(CommandError::bad)?;
            let Some(lock) = view.lock(&path)? else {
                return Err(CommandError::not_found(format!("File {path} is not locked")).into());
            };
            let is_foreign = agent_id.as_deref() != Some(lock.agent_id.as_str());
            // The holder's row is read only when it decides: a forced release by another agent.
            let holder_alive = || -> Result<bool, DecideError> {
                Ok(view.agent(&lock.agent_id)?.is_some_and(|holder| context.liveness.is_alive(holder.pid)))
            };
            if *force && is_foreign && !by_user && lock.expires_ms > now_ms && holder_alive()? {
                return Err(CommandError::forbidden(format!(
                    "File {path} is locked by {} until its lock expires, and that agent is running: only the user may force-release it",
                    lock.agent_id
                ))
                .into());
            }
            if !force && agent_id.as_deref() != Some(lock.agent_id.as_str()) {
                return Err(CommandError::forbidden(format!(
                    "File {path} is locked by {}, not {}; pass --force to release it anyway",
                    lock.agent_id,
                    agent_id.as_deref().unwrap_or("you")
                ))
                .into());
            }
            decision(
                agent_id.as_deref(),
                vec![Event::FileLockReleased { path, agent_id: lock.agent_id, forced: *force }],
            )
        }
        FileCommand::Record { path, agent_id, task_id, change_type, intent } => {
            let path = normalize(path).map_err(CommandError::bad)?;
            require_agent(view, agent_id)?;
            let task = super::command::checks::find_task(view, task_id)?
                .ok_or_else(|| CommandError::not_found(format!("Task {task_id} not found")))?;
            decision(
                Some(agent_id),
                vec![Event::FileModified {
                    path,
                    agent_id: agent_id.clone(),
                    task_id: task.id,
                    change_type: *change_type,
                    intent: intent.clone(),
                }],
            )
        }
        FileCommand::Cleanup { keep_days } => {
            let mut events = Vec::new();
            if let Some(days) = keep_days {
                if *days == 0 {
                    return Err(CommandError::bad("--days must be a positive number of days").into());
                }
                events.push(Event::FileModificationsPruned {
                    before_ms: now_ms.saturating_sub(days.saturating_mul(86_400_000)),
                });
            }
            for lock in view.locks()? {
                let stale = lock.expires_ms <= now_ms || !view.agent_exists(&lock.agent_id)?;
                if stale {
                    events.push(Event::FileLockReleased { path: lock.path, agent_id: lock.agent_id, forced: true });
                }
            }
            decision(None, events)
        }
    }
}

/// Read-only check for `POST /file-safety/validate` and `synapse file-safety check`.
pub fn check(
    view: &crate::store::projection::ReadProjections,
    path: &str,
    aliases: &[String],
    agent: &str,
    now_ms: u64,
) -> Result<crate::api::Validation, StoreError> {
    let holder_registered = |holder: &str| view.agent(holder).ok().flatten().is_some();
    let (mut allowed, mut reason, mut lock) = may_write(view.lock(path)?, holder_registered, agent, now_ms);
    // A lock kept under another name of the file binds too (see [`aliases`]).
    for alias in aliases {
        if !allowed {
            break;
        }
        let (alias_allowed, alias_reason, alias_lock) = may_write(view.lock(alias)?, holder_registered, agent, now_ms);
        if !alias_allowed {
            (allowed, reason, lock) = (false, format!("{alias_reason} (as {alias})"), alias_lock);
        }
    }
    let recent_modifications = view.modifications_of(path, 10)?;
    Ok(crate::api::Validation {
        path: path.to_string(),
        agent_id: agent.to_string(),
        allowed,
        reason,
        lock,
        recent_modifications,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(holder: &str, expires_ms: u64) -> FileLock {
        FileLock { path: "/a".into(), agent_id: holder.into(), expires_ms, acquired_ms: 0, intent: None, task_id: None }
    }

    #[test]
    fn a_lock_binds_until_its_expiry_measured_by_an_explicit_now() {
        let alive = |_: &str| true;
        assert!(!may_write(Some(lock("x", 1_000)), alive, "y", 999).0);
        let (allowed, reason, _) = may_write(Some(lock("x", 1_000)), alive, "y", 1_000);
        assert!(allowed, "{reason}");
        assert!(reason.contains("expired"));
        assert!(may_write(Some(lock("x", 1_000)), alive, "x", 10).0, "the holder may write");
        assert!(may_write(Some(lock("x", 1_000)), |_: &str| false, "y", 10).0, "a gone holder frees the lock");
        assert!(may_write(None, alive, "y", 10).0);
        let (_, reason, _) = may_write(Some(lock("x", 1_000)), alive, "y", 10);
        assert!(reason.starts_with("File is already locked by x until 1970-01-01T00:00:01.000Z"), "{reason}");
    }

    #[test]
    fn paths_are_absolute_and_lexically_normalised() {
        assert_eq!(normalize("/a/./b/../c//d").unwrap(), "/a/c/d");
        assert_eq!(normalize("/../../etc").unwrap(), "/etc");
        assert!(normalize("relative/path").is_err());
        assert!(normalize("").is_err());
        assert!(normalize("/tmp/a\u{1b}]52;c;x\u{7}").unwrap_err().contains("control character"));
        let longest = format!("/{}", "a".repeat(crate::api::PATH_MAX_BYTES - 1));
        assert_eq!(canonical(&longest).unwrap(), longest);
        let too_long = canonical(&format!("{longest}b")).unwrap_err();
        assert!(too_long.contains("4097 bytes long; a path is at most 4096 bytes"), "{too_long}");
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        std::fs::create_dir(real.join("src")).unwrap();
        std::fs::write(real.join("src/main.rs"), "").unwrap();
        std::os::unix::fs::symlink(real.join("src"), real.join("link")).unwrap();
        let expected = real.join("src/main.rs").display().to_string();
        assert_eq!(canonical(&real.join("link/main.rs").display().to_string()).unwrap(), expected);
        let not_yet = real.join("link/new/file.rs").display().to_string();
        assert_eq!(canonical(&not_yet).unwrap(), real.join("src/new/file.rs").display().to_string());
        // `..` after a link leaves its target (as open(2) does), not the link's directory.
        std::fs::create_dir_all(real.join("other/sub")).unwrap();
        std::os::unix::fs::symlink(real.join("other/sub"), real.join("deep")).unwrap();
        let through = real.join("deep/../main.rs").display().to_string();
        assert_eq!(canonical(&through).unwrap(), real.join("other/main.rs").display().to_string());
        let gone = real.join("missing/../src/./main.rs").display().to_string();
        assert_eq!(canonical(&gone).unwrap(), expected, "a missing part is normalised as text");
        // A short path through a link may resolve to one longer than PATH_MAX: still a file.
        // (The deep directory is made through links, each step's path short.)
        let name = "d".repeat(240);
        let mut step = real.clone();
        for level in 0..16 {
            std::fs::create_dir(step.join(&name)).unwrap();
            let link = real.join(format!("s{level}"));
            std::os::unix::fs::symlink(step.join(&name), &link).unwrap();
            step = link;
        }
        let through_deep = format!("{}/{}/{}", step.display(), "x".repeat(250), "y".repeat(250));
        let resolved = canonical(&through_deep).unwrap();
        assert!(resolved.len() > 4096 && resolved.ends_with(&"y".repeat(250)), "{}", resolved.len());
        // Many missing parts after a link, each length of the missing run (the halving).
        for missing in [1, 2, 3, 7, 300] {
            let tail = "/m".repeat(missing);
            let deep = format!("{}{tail}/f.rs", real.join("link").display());
            assert_eq!(canonical(&deep).unwrap(), format!("{}{tail}/f.rs", real.join("src").display()), "{missing}");
        }
    }
}
