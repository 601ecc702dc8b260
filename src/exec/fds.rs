//! File descriptors handed between the processes of one job over Unix-domain sockets
//! (`SCM_RIGHTS`): how a rank gives its peers the POSIX file descriptor of GPU memory it made with
//! `cuMemCreate` (the device layer's shareable memory), without `pidfd_getfd` — which needs
//! `CAP_SYS_PTRACE`, absent in most containers.
//!
//! Each rank that exports runs an [`FdServer`] on an abstract socket (a name in the network
//! namespace, not a file: nothing is left behind when the process dies), named after the job and
//! the rank. A peer [`fetch`]es a descriptor by a key (the exporting rank's address of the
//! memory): it sends the key, and receives one byte — 1 when the key is known — with the
//! descriptor attached. The received descriptor is a new one in the fetching process, owned by
//! the caller.
//!
//! Only the job's processes are served and trusted: the server answers a client only when the
//! kernel says (`SO_PEERCRED`) that it runs as this user in one of the job's processes, and a
//! client takes an answer only from the process it expects — an abstract socket has no file
//! permissions, and any local process could otherwise fetch a job's memory or pose as a rank.
//!
//! Invariant: no client waits for another (each is answered on a thread of its own, whose read
//! and write time out), the server stops when dropped, and every descriptor it sends is a
//! duplicate, so its owner's stays open.

use super::job::Process;
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long one exchange with a client or server may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

fn os_error(what: String) -> Error {
    Error::Resource {
        what: format!("{what}: {}", std::io::Error::last_os_error()),
    }
}

fn io_error(what: String, err: std::io::Error) -> Error {
    Error::Resource {
        what: format!("{what}: {err}"),
    }
}

/// The abstract socket address `name`.
fn address(name: &str) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| io_error(format!("the socket name {name:?}"), e))
}

/// Serves descriptors by key on the abstract socket `name` (module doc), until dropped.
pub(crate) struct FdServer {
    name: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FdServer {
    /// Listens on `name` and answers each request with `lookup(key)`'s descriptor (a borrowed
    /// one: it is duplicated into the reply by the kernel).
    /// Clients must be processes of `allowed` running as this user ([`admits`]).
    pub(crate) fn start(
        name: &str,
        allowed: Vec<Process>,
        lookup: impl Fn(u64) -> Option<OwnedFd> + Send + Sync + 'static,
    ) -> Result<FdServer> {
        let listener = UnixListener::bind_addr(&address(name)?)
            .map_err(|e| io_error(format!("cannot listen on the socket {name:?}"), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringreduce-fds".into())
            .spawn(move || {
                let lookup = Arc::new(lookup);
                let allowed = Arc::new(allowed);
                for client in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    // Each client on a thread of its own, so that one that never asks delays no
                    // other; one that misbehaves loses its answer, nothing else.
                    if let Ok(client) = client {
                        let (lookup, allowed) = (lookup.clone(), allowed.clone());
                        let _ = std::thread::Builder::new()
                            .name("ringreduce-fd".into())
                            .spawn(move || {
                                // A stranger's connection is closed unanswered.
                                match peer(&client) {
                                    Ok(pid) if admits(&allowed, pid) => answer(client, &*lookup),
                                    _ => Ok(()),
                                }
                            });
                    }
                }
            })
            .map_err(|e| io_error("cannot start the descriptor server".into(), e))?;
        Ok(FdServer {
            name: name.to_string(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept; if the connection fails the thread is not waiting there.
        if let Ok(addr) = address(&self.name) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether a client whose pid here is `pid` may be one of the `allowed` processes: a process of
/// the job whose pid names it here, or — when some of them run in another PID namespace, whose
/// clients the kernel shows under other pids (or 0) — any process of this user.
fn admits(allowed: &[Process], pid: u32) -> bool {
    allowed
        .iter()
        .any(|p| !p.here || (p.pid == pid && pid != 0))
}

/// The process at the other end of `stream`, when it runs as this user (`SO_PEERCRED`).
fn peer(stream: &UnixStream) -> Result<u32> {
    // SAFETY: an all-zero ucred is a valid value to be overwritten.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a live socket; `cred` and `len` are writable and describe each other.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if got != 0 {
        return Err(os_error("the peer of a descriptor socket".into()));
    }
    // SAFETY: geteuid cannot fail.
    match cred.uid == unsafe { libc::geteuid() } {
        true => Ok(cred.pid as u32),
        false => Err(Error::Resource {
            what: format!(
                "the descriptor socket's peer (pid {}) runs as another user",
                cred.pid
            ),
        }),
    }
}

/// One request: the key in, the answer out.
fn answer(mut client: UnixStream, lookup: &impl Fn(u64) -> Option<OwnedFd>) -> Result<()> {
    client
        .set_read_timeout(Some(EXCHANGE_TIMEOUT))
        .and_then(|()| client.set_write_timeout(Some(EXCHANGE_TIMEOUT)))
        .map_err(|e| io_error("a descriptor request".into(), e))?;
    let mut key = [0u8; 8];
    client
        .read_exact(&mut key)
        .map_err(|e| io_error("a descriptor request".into(), e))?;
    match lookup(u64::from_le_bytes(key)) {
        Some(fd) => send_fd(&client, fd.as_raw_fd()),
        None => client
            .write_all(&[0])
            .map_err(|e| io_error("a descriptor answer".into(), e)),
    }
}

/// Sends the byte 1 with a duplicate of `fd` attached.
fn send_fd(stream: &UnixStream, fd: RawFd) -> Result<()> {
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // u64 words keep the control buffer aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: an all-zero msghdr is a valid empty one; the pointers set below outlive sendmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` has a control buffer of `space` bytes, room for one header with one fd
    // (asserted above); CMSG_FIRSTHDR is then non-null and CMSG_DATA points inside it.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` is fully initialized above and its buffers live across the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent != 1 {
        return Err(os_error("cannot send a descriptor".into()));
    }
    Ok(())
}

/// Asks the server on `name`, which must be process `server` running as this user (its pid is
/// checked where it names the process here: [`Process`]), for the descriptor of `key`: `None` when the server does not know the key, an error when no server
/// (or another process) answers.
pub(crate) fn fetch(name: &str, server: Process, key: u64) -> Result<Option<OwnedFd>> {
    let mut stream = UnixStream::connect_addr(&address(name)?)
        .map_err(|e| io_error(format!("cannot reach the descriptor server {name:?}"), e))?;
    let answering = peer(&stream)?;
    if server.pid_here().is_some_and(|server| answering != server) {
        return Err(Error::Resource {
            what: format!(
                "the descriptor socket {name:?} is held by process {answering}, not the rank's \
                 process {}",
                server.pid
            ),
        });
    }
    stream
        .set_read_timeout(Some(EXCHANGE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(EXCHANGE_TIMEOUT)))
        .and_then(|()| stream.write_all(&key.to_le_bytes()))
        .map_err(|e| io_error(format!("a descriptor request to {name:?}"), e))?;
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is a valid empty one; the pointers set below outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` describes live buffers of the lengths given; CLOEXEC keeps the new
    // descriptor out of children.
    let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    match got {
        1 => {}
        0 => {
            return Err(Error::Resource {
                what: format!("the descriptor server {name:?} closed without an answer"),
            })
        }
        _ => {
            return Err(os_error(format!(
                "no answer from the descriptor server {name:?}"
            )))
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(Error::Resource {
            what: format!("the descriptor server {name:?} sent more than one descriptor"),
        });
    }
    // SAFETY: recvmsg filled `msg`'s control buffer (msg_controllen says how much of it);
    // CMSG_FIRSTHDR is null when there is none, and CMSG_DATA of an SCM_RIGHTS header holds fds.
    let fd = unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        match header.is_null() {
            false
                if (*header).cmsg_level == libc::SOL_SOCKET
                    && (*header).cmsg_type == libc::SCM_RIGHTS =>
            {
                Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(header).cast::<RawFd>(),
                ))
            }
            _ => None,
        }
    };
    // SAFETY: the kernel installed `fd` in this process for us alone; owned from here on (and
    // closed on every path below but the one that returns it).
    let fd = fd.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    match (byte[0], fd) {
        (1, Some(fd)) => Ok(Some(fd)),
        (0, None) => Ok(None),
        _ => Err(Error::Resource {
            what: format!("the descriptor server {name:?} answered out of protocol"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    /// A new anonymous file.
    fn memfd() -> std::fs::File {
        // SAFETY: a NUL-terminated name and a valid flag; the descriptor returned is ours.
        let fd = unsafe { libc::memfd_create(c"ringreduce-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just opened and is owned by nothing else.
        std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Process `pid` of this PID namespace.
    fn here(pid: u32) -> Process {
        Process { pid, here: true }
    }

    fn name(test: &str) -> String {
        format!("ringreduce-test-{test}-{}", std::process::id())
    }

    #[test]
    fn a_descriptor_crosses_a_socket_and_names_the_same_file() {
        let mut file = memfd();
        file.write_all(b"shared bytes").unwrap();
        let original: OwnedFd = file.into();
        let served = original.try_clone().unwrap();
        let name = name("crosses");
        let me = here(std::process::id());
        let server = FdServer::start(&name, vec![me], move |key| match key {
            42 => served.try_clone().ok(),
            _ => None,
        })
        .unwrap();
        let fd = fetch(&name, me, 42).unwrap().expect("key 42 is served");
        assert_ne!(fd.as_raw_fd(), original.as_raw_fd(), "a new descriptor");
        let mut received = std::fs::File::from(fd);
        received.rewind().unwrap();
        let mut text = String::new();
        received.read_to_string(&mut text).unwrap();
        assert_eq!(text, "shared bytes");
        assert!(fetch(&name, me, 7).unwrap().is_none(), "an unknown key");
        // The server is not the process the client expects: no answer taken.
        let err = fetch(&name, here(me.pid + 1), 42).unwrap_err().to_string();
        assert!(err.contains("not the rank's process"), "{err}");
        drop(server);
        let err = fetch(&name, me, 42).unwrap_err().to_string();
        assert!(err.contains("cannot reach"), "{err}");
    }

    #[test]
    fn a_process_outside_the_job_gets_nothing() {
        let file: OwnedFd = memfd().into();
        let name = name("stranger");
        // Only process 1 (never this test) may ask.
        let server = FdServer::start(&name, vec![here(1)], move |_| file.try_clone().ok()).unwrap();
        // Closed unanswered (or reset, the key unread): an error, never a descriptor.
        let err = fetch(&name, here(std::process::id()), 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("descriptor server"), "{err}");
        drop(server);
    }

    #[test]
    fn a_client_that_never_asks_does_not_stop_the_server() {
        let file: OwnedFd = memfd().into();
        let name = name("silent");
        let me = here(std::process::id());
        let server = FdServer::start(&name, vec![me], move |_| file.try_clone().ok()).unwrap();
        let silent = UnixStream::connect_addr(&address(&name).unwrap()).unwrap();
        let started = std::time::Instant::now();
        assert!(fetch(&name, me, 1).unwrap().is_some());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited for the silent one"
        );
        drop(silent);
        drop(server);
    }

    /// Ranks in other PID namespaces (containers): their pids mean nothing here. A server admits
    /// a client by pid only where every rank's pid names its process here; the client skips the
    /// server's pid check where the server's does not. Two ranks numbered pid 1 in two
    /// containers are not one process.
    #[test]
    fn pids_count_only_in_their_own_pid_namespace() {
        let records = [(1, 7), (1, 9), (40, 7)];
        let seen = Process::of(&records, 0);
        assert_eq!(seen[0], here(1));
        assert_eq!(
            seen[1],
            Process {
                pid: 1,
                here: false
            }
        );
        assert_eq!(seen[2].pid_here(), Some(40));
        assert_eq!(seen[1].pid_here(), None);
        // All here: only the job's pids (and never 0, the kernel's "not visible").
        assert!(admits(&[here(5), here(6)], 6));
        assert!(!admits(&[here(5), here(6)], 7));
        assert!(!admits(&[here(0)], 0));
        // One elsewhere: its clients come with pids we cannot check, so any of this user's.
        assert!(admits(&seen, 1234));
        assert!(admits(&seen, 0));

        let file: OwnedFd = memfd().into();
        let name = name("elsewhere");
        let server = FdServer::start(
            &name,
            vec![Process {
                pid: 1,
                here: false,
            }],
            move |_| file.try_clone().ok(),
        )
        .unwrap();
        // This process, whatever its pid here, is admitted, and the client does not hold the
        // server to the rank's pid (1, in its own namespace).
        let elsewhere = Process {
            pid: 1,
            here: false,
        };
        assert!(fetch(&name, elsewhere, 3).unwrap().is_some());
        drop(server);
    }
}
