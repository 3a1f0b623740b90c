//! What the broker and the CLI may believe about a local process, and the signals they send.
//!
//! Liveness: [`pid_exists`] is one system call (the hot path); [`is_pid_alive`] also reads
//! `/proc` so that a zombie counts as gone. A pid alone proves nothing: any process can name
//! any pid, and pids are reused. So an agent's registration is checked against the registering
//! peer's kernel-given credentials ([`is_related`]), the registered process's start time is
//! recorded ([`start_ticks`]) so a reused pid is told apart, and `synapse stop` signals a process
//! only when it runs a `synapse` executable ([`runs_one_of`]) that started when the
//! registration says it did.
//!
//! Whether a caller is inside an agent is decided from its [`lineage`] (read when its
//! connection is accepted, before a parent can exit and have it reparented) against the
//! registered wrappers' pids *and start times*, never from the executable file (which a
//! rebuild replaces).
//!
//! This module reads the process table; it imports nothing of the crate. The broker's
//! decisions never call it: the writer looks liveness up before deciding (see
//! `broker::command`).

/// Does a process with this pid exist? One system call (signal 0 checks existence without
/// sending anything); a zombie still counts. The hot path of every send uses this; the
/// liveness sweeper uses [`is_pid_alive`].
pub fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    #[allow(unsafe_code)]
    // SAFETY: kill with signal 0 performs only the existence and permission check.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The uid of the process at the other end of a connected Unix socket, as the kernel gives it
/// (`SO_PEERCRED`); None when it cannot be read.
pub fn socket_peer_uid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    #[allow(unsafe_code)]
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`, a ucred as SO_PEERCRED
    // asks, and sets `length` to what it wrote; the descriptor is the open socket's own.
    let result = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &raw mut length,
        )
    };
    (result == 0 && usize::try_from(length).ok() == Some(std::mem::size_of::<libc::ucred>())).then_some(credentials.uid)
}

/// Is this process alive? A zombie (exited, not yet reaped by its parent) is gone for our
/// purposes.
pub fn is_pid_alive(pid: u32) -> bool {
    pid_exists(pid) && !is_zombie(pid)
}

/// Has this process exited without being reaped yet? False for one that runs, or is gone.
pub fn is_zombie(pid: u32) -> bool {
    let Some(stat) = read_proc_stat(&format!("/proc/{pid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may contain spaces.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("Z")
}

/// Raises this process's soft limit of open files towards its hard limit, to `wanted` at most;
/// the limit in force after, or None when it cannot be read.
pub fn raise_open_files_limit(wanted: u64) -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    #[allow(unsafe_code)]
    // SAFETY: getrlimit writes one rlimit, which `limit` is.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) };
    if read != 0 {
        return None;
    }
    let target = wanted.min(limit.rlim_max);
    if limit.rlim_cur < target {
        let raised = libc::rlimit { rlim_cur: target, rlim_max: limit.rlim_max };
        #[allow(unsafe_code)]
        // SAFETY: setrlimit only reads the rlimit it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            return Some(target);
        }
    }
    Some(limit.rlim_cur)
}

/// Hands the allocator's free pages back to the system. glibc keeps what a thread freed in
/// that thread's arena, so a burst of work on a pool thread (a history index step merging its
/// segments, hundreds of MB at 1M events) would otherwise stay in the broker's RSS for good.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim only walks the allocator's own free lists and returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sweeps still to trim after work that may have freed much memory on a pool thread (a read as
/// long as the log is); see [`memory_to_release`].
static SWEEPS_TO_TRIM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Notes that work which may have freed much memory ran (a history or task read, a stream
/// catching up with the log): the broker's next two sweeps hand the free pages back. Two, since
/// what such a read returns is freed later, once its answer is written, possibly after the
/// first sweep. A broker that served such reads otherwise kept their peak in its RSS for good (a
/// soak of two minutes of history reads: 76 → 161 MB, and no lower once idle).
pub fn note_large_work() {
    SWEEPS_TO_TRIM.store(2, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this sweep should hand free memory back ([`note_large_work`]); counts it down.
pub fn memory_to_release() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    SWEEPS_TO_TRIM.fetch_update(Relaxed, Relaxed, |left| left.checked_sub(1)).is_ok()
}

/// [`release_free_memory`], with the resident size before and after, in kB.
pub fn release_free_memory_measured() -> (u64, u64) {
    let before = resident_kb();
    release_free_memory();
    (before, resident_kb())
}

/// This process's resident size in kB (`VmRSS`), 0 when unknown.
fn resident_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Sends `signal` to a process group (negative pid) or a process; true when it was sent.
pub fn signal(pid: i32, signal: i32) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(pid, signal) == 0
    }
}

/// The process's start time (field 22 of `/proc/<pid>/stat`, clock ticks since boot): with the
/// pid it names one process for the machine's uptime. None when the process is gone.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// One process for the machine's uptime: its pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStamp {
    pub pid: u32,
    pub start_ticks: u64,
}

impl ProcessStamp {
    /// The process `pid` now; None when it is gone or unreadable.
    pub fn of(pid: u32) -> Option<ProcessStamp> {
        Some(ProcessStamp { pid, start_ticks: start_ticks(pid)? })
    }

    /// Is this very process (not a later one with its pid) still running? A zombie (exited,
    /// not yet reaped by its parent) is not.
    pub fn is_running(&self) -> bool {
        running_start_ticks(self.pid) == Some(self.start_ticks)
    }

    /// Is this the process a registration recorded (`pid`, and `pid_start` when recorded)?
    pub fn is(&self, pid: u32, pid_start: Option<u64>) -> bool {
        self.pid == pid && pid_start.is_none_or(|start| start == self.start_ticks)
    }
}

/// The process `pid` first, then its ancestors (nearest first), then its session leader and
/// the leader's ancestors. The session leader is there because a process that double-forks
/// to be reparented to init keeps its session (a wrapped CLI leads the session of its PTY):
/// only `setsid` leaves it. None when `pid` itself is gone or unreadable: such a caller proves
/// nothing.
pub fn lineage(pid: u32) -> Option<Vec<ProcessStamp>> {
    let fields = stat_fields(pid)?;
    if is_exited(&fields) {
        return None;
    }
    let mut lineage = vec![ProcessStamp { pid, start_ticks: fields.get(19)?.parse().ok()? }];
    let session: Option<u32> = fields.get(3).and_then(|sid| sid.parse().ok());
    push_ancestors(&mut lineage, fields.get(1).and_then(|ppid| ppid.parse().ok()));
    if let Some(leader) = session
        && leader > 1
        && !lineage.iter().any(|stamp| stamp.pid == leader)
        && let Some((stamp, parent)) = stamp_and_parent(leader)
    {
        lineage.push(stamp);
        push_ancestors(&mut lineage, parent);
    }
    Some(lineage)
}

fn push_ancestors(lineage: &mut Vec<ProcessStamp>, mut parent: Option<u32>) {
    for _ in 0..MAX_ANCESTRY {
        let Some(pid) = parent.filter(|&pid| pid > 1) else { return };
        if lineage.iter().any(|stamp| stamp.pid == pid) {
            return;
        }
        let Some((stamp, next)) = stamp_and_parent(pid) else { return };
        lineage.push(stamp);
        parent = next;
    }
}

/// A process's stamp and its parent's pid, from one read of its `stat`.
fn stamp_and_parent(pid: u32) -> Option<(ProcessStamp, Option<u32>)> {
    let fields = stat_fields(pid)?;
    let stamp = ProcessStamp { pid, start_ticks: fields.get(19)?.parse().ok()? };
    Some((stamp, fields.get(1).and_then(|ppid| ppid.parse().ok())))
}

/// Like [`start_ticks`], but None for a process that has exited and is not yet reaped.
fn running_start_ticks(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    if is_exited(&fields) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Zombie (`Z`) or dead (`X`, `x`): the process has exited.
fn is_exited(fields: &[String]) -> bool {
    fields.first().is_none_or(|state| matches!(state.as_str(), "Z" | "X" | "x"))
}

/// The parent's pid (field 4 of `/proc/<pid>/stat`).
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The fields after the command name (which is in parentheses and may hold spaces): index 0 is
/// field 3 (state), index 1 is field 4 (ppid), index 3 is field 6 (session), index 19 is field 22
/// (start time).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    if pid == 0 {
        return None;
    }
    let stat = read_proc_stat(&format!("/proc/{pid}/stat"))?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A `/proc/<pid>/stat` in one `read`: procfs reports a size of 0, so `read_to_string`
/// probes with reads of 32, 32, 64, 128 ... bytes (eight system calls for a `stat`), and the
/// broker reads several such files for every new connection. The kernel makes the whole line
/// at once, so a read that ends it (a newline, room left in the buffer) needs no second read to
/// see the end of the file. The command name in a `stat` may hold any bytes; the fields read
/// from it are ASCII.
fn read_proc_stat(path: &str) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut contents = Vec::new();
    let mut chunk = [0_u8; 1024];
    loop {
        let read = file.read(&mut chunk).ok()?;
        if read == 0 {
            break;
        }
        contents.extend_from_slice(&chunk[..read]);
        if read < chunk.len() && contents.ends_with(b"\n") {
            break;
        }
    }
    Some(String::from_utf8_lossy(&contents).into_owned())
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

/// Does `pid` run one of `executables` (the same file: device and inode)? A `synapse` wrapper
/// runs `synapse` or `synapse-agent`; a shell, a test binary or an editor runs neither.
pub fn runs_one_of(pid: u32, executables: &[std::path::PathBuf]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(theirs) = std::fs::metadata(format!("/proc/{pid}/exe")) else {
        return false;
    };
    executables
        .iter()
        .filter_map(|path| std::fs::metadata(path).ok())
        .any(|ours| theirs.dev() == ours.dev() && theirs.ino() == ours.ino())
}

/// The other end of a loopback TCP connection, as `/proc/net/tcp*` shows its socket: the uid
/// that owns it and its inode (by which [`socket_holder`] finds the process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    pub uid: u32,
    pub inode: u64,
}

/// The socket on this machine whose local address is `peer` and whose remote address is `ours`
/// (the caller's end of a connection we accepted). None when it cannot be told (not on this
/// machine, or gone already).
pub fn loopback_tcp_socket(ours: std::net::SocketAddr, peer: std::net::SocketAddr) -> Option<TcpSocket> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|table| {
        let text = std::fs::read_to_string(table).ok()?;
        text.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (parse_proc_address(fields.get(1)?)?, parse_proc_address(fields.get(2)?)?);
            if !(same_address(local, peer) && same_address(remote, ours)) {
                return None;
            }
            Some(TcpSocket { uid: fields.get(7)?.parse().ok()?, inode: fields.get(9)?.parse().ok()? })
        })
    })
}

/// The pid of a process holding the socket `inode` (one whose `/proc/<pid>/fd` names
/// `socket:[inode]`). Only processes this one may read are seen (the same user's, or all for
/// root). None when it cannot be told.
pub fn socket_holder(inode: u64) -> Option<u32> {
    if inode == 0 {
        return None;
    }
    let target = std::ffi::OsString::from(format!("socket:[{inode}]"));
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == target) {
                return Some(pid);
            }
        }
    }
    None
}

/// `0100007F:1F90` (IPv4) or 32 hex digits `:port` (IPv6), each 32-bit word in host order, as
/// `/proc/net/tcp*` prints a socket's address.
fn parse_proc_address(text: &str) -> Option<std::net::SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // The kernel prints each word as the number it is in memory: its bytes in host order.
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    match address.len() {
        8 => {
            let ip = std::net::Ipv4Addr::from(word(address)?);
            Some(std::net::SocketAddr::from((ip, port)))
        }
        32 => {
            let mut bytes = [0u8; 16];
            for (index, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(address.get(index * 8..index * 8 + 8)?)?);
            }
            Some(std::net::SocketAddr::from((std::net::Ipv6Addr::from(bytes), port)))
        }
        _ => None,
    }
}

/// The same endpoint, an IPv4 address and its IPv4-mapped IPv6 form counting as one.
fn same_address(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    let canonical = |address: std::net::SocketAddr| match address.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address.ip(), std::net::IpAddr::V4),
        ip => ip,
    };
    a.port() == b.port() && canonical(a) == canonical(b)
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
        let this = std::env::current_exe().expect("this executable");
        assert!(runs_one_of(me, &[std::path::PathBuf::from("/bin/sh"), this]));
        assert!(!runs_one_of(me, &[std::path::PathBuf::from("/bin/sh")]));
        assert!(!runs_one_of(me, &[]));
    }

    #[test]
    fn a_lineage_starts_with_the_process_and_holds_its_parent_and_a_zombie_has_none() {
        let me = std::process::id();
        let lineage = lineage(me).expect("this process is readable");
        assert_eq!(lineage[0], ProcessStamp::of(me).expect("a stamp"));
        let parent = parent_of(me).expect("a parent");
        assert!(parent <= 1 || lineage.iter().any(|stamp| stamp.pid == parent));
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        // Not reaped yet: a zombie, which proves nothing.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z ")) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(super::lineage(pid).is_none());
        assert!(is_zombie(pid) && !is_pid_alive(pid));
        assert!(!is_zombie(me) && is_pid_alive(me));
        let _ = child.wait();
        assert!(!is_zombie(pid), "reaped: gone, not a zombie");
    }

    /// One read gives the whole line, as reading to the end of the file does.
    #[test]
    fn a_stat_file_reads_whole() {
        // A sleeping child's line does not change between two reads (ours would: page faults).
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let path = format!("/proc/{}/stat", child.id());
        let mut whole = std::fs::read_to_string(&path).expect("its stat");
        // Until it has exec'd sleep and sleeps (state S), its line moves.
        while !whole.contains("(sleep) S ") {
            std::thread::yield_now();
            whole = std::fs::read_to_string(&path).expect("its stat");
        }
        assert!(whole.ends_with('\n'));
        assert_eq!(read_proc_stat(&path).as_deref(), Some(whole.as_str()));
        assert_eq!(read_proc_stat("/proc/0/stat"), None);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn proc_net_tcp_addresses_are_read_in_host_order_and_our_own_connection_is_found() {
        use std::net::SocketAddr;
        assert_eq!(parse_proc_address("0100007F:1F90"), Some(SocketAddr::from(([127, 0, 0, 1], 8080))));
        let loopback_v6: SocketAddr = "[::1]:80".parse().expect("an address");
        assert_eq!(parse_proc_address("00000000000000000000000001000000:0050"), Some(loopback_v6));
        assert_eq!(parse_proc_address("nonsense"), None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let client = std::net::TcpStream::connect(listener.local_addr().expect("its address")).expect("a client");
        let (server, peer) = listener.accept().expect("the connection");
        assert_eq!(peer, client.local_addr().expect("the client's address"));
        let socket = loopback_tcp_socket(server.local_addr().expect("our address"), peer).expect("the client's socket");
        assert_eq!(socket.uid, crate::private_files::my_uid());
        assert_eq!(socket_holder(socket.inode), Some(std::process::id()), "this process holds the client's end");
    }

    #[test]
    fn a_sibling_process_is_not_related() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let me = std::process::id();
        assert!(is_related(me, child.id()), "a child may be registered by its parent");
        // Seen from the child, the parent is an ancestor; a second child is unrelated to it.
        let mut other = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        assert!(!is_related(child.id(), other.id()));
        assert!(!runs_one_of(child.id(), &[std::env::current_exe().expect("this executable")]));
        assert!(descends_from(child.id(), &[me]));
        assert!(!descends_from(child.id(), &[other.id()]));
        assert!(!descends_from(me, &[child.id()]));
        let _ = child.kill();
        let _ = other.kill();
        let _ = child.wait();
        let _ = other.wait();
    }
}
