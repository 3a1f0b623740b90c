//! `synapse init` and `synapse reset`: the settings files (SPEC §6).

use crate::config::Paths;
use crate::settings::{scope_files, template};
use anyhow::{Context, bail};
use std::io::IsTerminal;

fn scope_path(paths: &Paths, scope: &str) -> anyhow::Result<std::path::PathBuf> {
    let project = std::env::current_dir().context("cannot read the current directory")?;
    scope_files(&paths.home, &project)
        .into_iter()
        .find(|(name, _)| *name == scope)
        .map(|(_, path)| path)
        .ok_or_else(|| anyhow::anyhow!("unknown scope '{scope}' (user, project, local)"))
}

/// Writes the commented template; refuses to overwrite without `--force`.
pub fn init(paths: &Paths, scope: &str, force: bool) -> anyhow::Result<i32> {
    let path = scope_path(paths, scope)?;
    // Every scope also writes the broker's security settings into the home.
    paths.own_home()?;
    // A link counts as a file there, even one to nothing: a cloned project's link must not make
    // `init` create or replace a file elsewhere.
    let existing = path.symlink_metadata().ok();
    if existing.is_some() && !force {
        bail!("{} already exists; pass --force to overwrite it", path.display());
    }
    let was_link = existing.is_some_and(|meta| meta.file_type().is_symlink());
    if let Some(dir) = path.parent() {
        if scope != "user" && dir.symlink_metadata().is_ok_and(|meta| meta.file_type().is_symlink()) {
            bail!("{} is a symbolic link; a project's settings are written in the project itself", dir.display());
        }
        crate::private_files::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&template())?;
    // A new file renamed over the old: the link itself is replaced, never its target, and a
    // crash leaves the old file or the new one, never half of one.
    crate::private_files::replace(&path, format!("{text}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("Wrote {} ({scope} settings)", path.display());
    if was_link {
        println!("It was a symbolic link: the link is replaced by this file, and what it pointed to is unchanged.");
    }
    // The broker's security settings (auth, keys, localhost rule, file safety) live in the home,
    // so that a broker autostarted after a crash has them too.
    crate::trust::TrustSettings::update_from_env(&paths.home)?;
    Ok(0)
}

/// Restores the defaults of a scope by removing its file; asks first unless `--force`.
pub fn reset(paths: &Paths, scope: &str, force: bool) -> anyhow::Result<i32> {
    let path = scope_path(paths, scope)?;
    if scope == "user" {
        paths.own_home()?;
    }
    if !path.exists() {
        println!("{} does not exist: the {scope} settings are the defaults already", path.display());
        return Ok(0);
    }
    if !force {
        if !std::io::stdin().is_terminal() {
            bail!("not removing {} without confirmation; pass -f to reset without asking", path.display());
        }
        eprint!("Remove {} and restore the defaults? [y/N] ", path.display());
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("Nothing changed.");
            return Ok(1);
        }
    }
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    println!("Removed {}: the {scope} settings are the defaults again", path.display());
    Ok(0)
}
