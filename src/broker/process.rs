//! What the broker and the CLI may believe about a local process, read from `/proc`.
//!
//! A pid alone proves nothing: any process can name any pid, and pids are reused. So an
//! agent's registration is checked against the registering peer's kernel-given credentials
//! ([`is_related`]), the registered process's start time is recorded ([`start_ticks`]) so a
//! reused pid is told apart, and `synapse stop` signals a process only when it is a `synapse`
//! process ([`runs_this_executable`]) that started when the registration says it did.

/// The process's start time (field 22 of `/proc/<pid>/stat`, clock ticks since boot): with the
/// pid it names one process for the machine's uptime. None when the process is gone.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// The parent's pid (field 4 of `/proc/<pid>/stat`).
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The fields after the command name (which is in parentheses and may hold spaces): index 0 is
/// field 3 (state), index 1 is field 4 (ppid), index 19 is field 22 (start time).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Longest ancestor chain walked (a cycle cannot happen in /proc, but a bound costs nothing).
const MAX_ANCESTRY: usize = 256;

/// May `peer` (a process proved by the kernel, e.g. the other end of a Unix socket) register
/// `pid`? Yes when `pid` is the peer itself, one of its ancestors, or its child: a wrapper
/// registers itself, `synapse agent register --pid $PPID` registers its caller, a launcher its
/// child. Never an unrelated process.
pub fn is_related(peer: u32, pid: u32) -> bool {
    // pid 1 (init) and 0 (the kernel) are everyone's ancestors: never registrable.
    if peer <= 1 || pid <= 1 {
        return false;
    }
    if peer == pid || parent_of(pid) == Some(peer) {
        return true;
    }
    let mut current = peer;
    for _ in 0..MAX_ANCESTRY {
        match parent_of(current) {
            Some(parent) if parent == pid => return true,
            Some(parent) if parent > 1 && parent != current => current = parent,
            _ => return false,
        }
    }
    false
}

/// Is `pid` a descendant of one of `ancestors` (its parent, grandparent, ...)?
pub fn descends_from(pid: u32, ancestors: &[u32]) -> bool {
    let mut current = pid;
    for _ in 0..MAX_ANCESTRY {
        match parent_of(current) {
            Some(parent) if ancestors.contains(&parent) => return true,
            Some(parent) if parent > 1 && parent != current => current = parent,
            _ => return false,
        }
    }
    false
}

/// Does `pid` run the same executable file as this process (same device and inode)? A
/// `synapse` wrapper does; a shell, a test binary or an editor does not.
pub fn runs_this_executable(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(theirs), Ok(ours)) = (std::fs::metadata(format!("/proc/{pid}/exe")), std::fs::metadata("/proc/self/exe"))
    else {
        return false;
    };
    theirs.dev() == ours.dev() && theirs.ino() == ours.ino()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_related_to_itself_and_its_parent_but_not_to_init() {
        let me = std::process::id();
        assert!(is_related(me, me));
        let parent = parent_of(me).expect("a parent");
        assert!(is_related(me, parent), "the parent is an ancestor");
        assert!(!is_related(me, 1), "init is nobody's to register");
        assert!(start_ticks(me).is_some());
        assert!(runs_this_executable(me));
    }

    #[test]
    fn a_sibling_process_is_not_related() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let me = std::process::id();
        assert!(is_related(me, child.id()), "a child may be registered by its parent");
        // Seen from the child, the parent is an ancestor; a second child is unrelated to it.
        let mut other = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        assert!(!is_related(child.id(), other.id()));
        assert!(!runs_this_executable(child.id()));
        assert!(descends_from(child.id(), &[me]));
        assert!(!descends_from(child.id(), &[other.id()]));
        assert!(!descends_from(me, &[child.id()]));
        let _ = child.kill();
        let _ = other.kill();
        let _ = child.wait();
        let _ = other.wait();
    }
}
