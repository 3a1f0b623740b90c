//! Files in `SYNAPSE_HOME` are the user's alone: directories 0700, files 0600, whoever creates
//! them (the broker, a client that autostarts it, an agent wrapper).
//!
//! The mode is given at creation (`DirBuilderExt::mode`, `OpenOptionsExt::mode`), so it does not
//! depend on the umask of the process that happens to create the file; a home left too open by an
//! older version is tightened when the broker starts ([`tighten_home`]). What must stay true:
//! nothing under the home is created through plain `create_dir_all` / `File::create` /
//! `fs::write`, which would give 0755 / 0644 under the usual umask 022.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every directory Synapse creates under its home.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file Synapse creates under its home.
pub const FILE_MODE: u32 = 0o600;

/// Creates a directory and its missing parents, each readable only by the user. Directories that
/// exist already keep their mode.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// This process's effective uid.
pub fn my_uid() -> u32 {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe {
        libc::geteuid()
    }
}

/// Creates `dir` (0700) or checks the one there: it must be a real directory (not a symlink)
/// owned by this user, and is made 0700 if it is more open. A directory of another user — say
/// `/tmp/synapse-a2a` made first by someone else — is refused: whoever owns it could put their
/// own socket where the broker's should be, or read ours.
pub fn own_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    create_dir(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() {
        return Err(std::io::Error::other(format!("{} is not a directory (a symlink?)", dir.display())));
    }
    refuse_unless_mine(
        dir,
        &meta,
        "its owner could serve a broker of its own there; set SYNAPSE_UDS_DIR to a directory of yours",
    )?;
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Creates the home (0700) or checks the one there: a directory (a link to one is taken, as a
/// user may keep the home elsewhere) owned by this user. A home of another user is refused:
/// whoever owns it decides what the broker trusts (`broker-settings.json`: other users, hosts,
/// origins) and what an agent runs (its profile's command), and can read every message.
pub fn own_home(dir: &Path) -> std::io::Result<()> {
    create_dir(dir)?;
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!("{} is not a directory", dir.display())));
    }
    refuse_unless_mine(
        dir,
        &meta,
        "its owner would decide what the broker trusts and what agents run; set SYNAPSE_HOME to a directory of yours",
    )
}

/// An error for a directory (`meta`) that belongs to another user, saying what its owner could
/// do and what to set instead (`risk`).
fn refuse_unless_mine(dir: &Path, meta: &std::fs::Metadata, risk: &str) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if meta.uid() == my_uid() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "{} belongs to uid {}, not to you (uid {}): {risk}",
        dir.display(),
        meta.uid(),
        my_uid()
    )))
}

/// Reads a file that decides what Synapse trusts or runs (a profile, the user's settings, the
/// broker's security settings): it must be this user's or root's (a profile a system manages:
/// Nix, configuration management) and not writable by others. A home left open, by an older
/// version or by hand, lets anyone plant one; the broker closes the home, not what is in it. A
/// group that can write is allowed: with a private group per user (umask 002) every file is so.
pub fn read_own(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    // Through a link, the file judged is its target: named too (worked out for a refusal only).
    let shown = || match std::fs::canonicalize(path) {
        Ok(target) if target != path => format!("{} (a link to {})", path.display(), target.display()),
        _ => path.display().to_string(),
    };
    if meta.uid() != my_uid() && meta.uid() != 0 {
        return Err(std::io::Error::other(format!(
            "{} belongs to uid {}, not to you (uid {}): refused; remove it, or chown it if it is yours",
            shown(),
            meta.uid(),
            my_uid()
        )));
    }
    if meta.mode() & 0o002 != 0 {
        return Err(std::io::Error::other(format!("{} can be written by anyone: refused; chmod o-w it", shown())));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Opens `path` for reading if it is a regular file (a link to one too). Anything else planted
/// there (a FIFO, whose open would wait for a writer) is refused without waiting.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", path.display())));
    }
    Ok(file)
}

/// Opens `path` for appending, creating it 0600 if needed.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(FILE_MODE).open(path)
}

/// Opens `path` for writing without truncating it (a lock file), creating it 0600 if needed.
pub fn open_write(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).truncate(false).write(true).mode(FILE_MODE).open(path)
}

/// Opens `path` for reading and writing without truncating it, creating it 0600 if needed.
pub fn open_read_write(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).truncate(false).read(true).write(true).mode(FILE_MODE).open(path)
}

/// Writes `contents` to `path` (replacing it), creating it 0600 if needed.
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut file = OpenOptions::new().create(true).truncate(true).write(true).mode(FILE_MODE).open(path)?;
    file.write_all(contents.as_ref())
}

/// Replaces `path` with a new file (0600) holding `contents`: written beside it, synced, then
/// renamed over it. A symlink at `path` is replaced, not followed.
pub fn replace(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| std::io::Error::other("not a file name"))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(".{}.tmp", std::process::id()));
    let temporary = path.with_file_name(temporary_name);
    // One left by a process of the same pid that died half-way.
    let _ = std::fs::remove_file(&temporary);
    let written = (|| {
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(FILE_MODE)
            .open(&temporary)?;
        file.write_all(contents.as_ref())?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Removes group and other permissions from the home, and from every directory and file in it
/// (sockets and symlinks are left alone; a symlink is never followed). Returns how many entries
/// were changed. Errors on single entries are skipped: a file that vanished meanwhile is fine.
pub fn tighten_home(home: &Path) -> std::io::Result<usize> {
    let mut changed = 0;
    let mut pending = vec![home.to_path_buf()];
    while let Some(dir) = pending.pop() {
        match tighten(&dir, DIR_MODE) {
            Ok(true) => changed += 1,
            Ok(false) => {}
            Err(error) if dir == home => return Err(error),
            // Not ours (another user put it there): the rest is still closed; such files are
            // refused where they would matter (`read_own`).
            Err(_) => {}
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() && tighten(&entry.path(), FILE_MODE).unwrap_or(false) {
                changed += 1;
            }
        }
    }
    Ok(changed)
}

/// Clears the group/other bits of `path` (keeping the user's own, capped by `mode`); true when
/// the mode changed.
fn tighten(path: &Path, mode: u32) -> std::io::Result<bool> {
    let metadata = std::fs::symlink_metadata(path)?;
    let current = metadata.permissions().mode() & 0o7777;
    if current & 0o077 == 0 {
        return Ok(false);
    }
    let wanted = current & mode;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_files_and_directories_are_private_whatever_the_umask() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("home/logs");
        create_dir(&dir).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        assert_eq!(mode_of(&base.path().join("home")), 0o700);
        let file = dir.join("a.log");
        drop(open_append(&file).unwrap());
        assert_eq!(mode_of(&file), 0o600);
        write(&dir.join("b.txt"), "x").unwrap();
        assert_eq!(mode_of(&dir.join("b.txt")), 0o600);
    }

    #[test]
    fn an_open_home_is_tightened_recursively() {
        let base = tempfile::tempdir().unwrap();
        let home = base.path().join("home");
        std::fs::create_dir_all(home.join("messages/agent")).unwrap();
        std::fs::write(home.join("messages/agent/1.txt"), "secret").unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(home.join("messages/agent/1.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(tighten_home(&home).unwrap() >= 2);
        assert_eq!(mode_of(&home), 0o700);
        assert_eq!(mode_of(&home.join("messages/agent/1.txt")), 0o600);
        assert_eq!(tighten_home(&home).unwrap(), 0);
    }

    /// A directory of another user in the home (put there while it was open) does not stop the
    /// closing of the rest: it had ended the walk, leaving what came after it open.
    #[test]
    fn a_directory_of_another_user_in_the_home_does_not_stop_the_tightening() {
        if my_uid() != 0 {
            eprintln!("SKIPPED: needs root to make a directory of another user that root cannot chmod");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let home = base.path().join("home");
        let mine = home.join("planted/mine");
        std::fs::create_dir_all(&mine).unwrap();
        for dir in [&home, &home.join("planted"), &mine] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        std::os::unix::fs::chown(home.join("planted"), Some(65534), Some(65534)).unwrap();
        // Root may chmod another user's directory; a user may not. Made immutable, it refuses
        // root too, as another user's directory refuses a user.
        let immutable = std::process::Command::new("chattr").arg("+i").arg(home.join("planted")).status();
        if !immutable.is_ok_and(|status| status.success()) {
            eprintln!("SKIPPED: chattr +i is not available here");
            return;
        }
        let result = tighten_home(&home);
        let _ = std::process::Command::new("chattr").arg("-i").arg(home.join("planted")).status();
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(mode_of(&home), 0o700);
        assert_eq!(mode_of(&mine), 0o700, "what lies past the foreign directory is closed too");
    }
}
