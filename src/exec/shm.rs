//! Shared memory between the processes of one job: a named POSIX segment (`shm_open`, a file in
//! `/dev/shm` on Linux) that one rank creates and its peers map, each at its own address.
//!
//! A segment's bytes are reserved when it is made (`posix_fallocate`), so a `/dev/shm` too small
//! for it — Docker's default is 64 MB — is an error naming the size and what to do, at
//! creation, never a `SIGBUS` at the first touch of a page that tmpfs cannot back. The creator
//! unlinks the name as soon as every peer has mapped it ([`Segment::unlink`]): the memory lives
//! while a mapping does, and a process killed afterwards leaves nothing behind in `/dev/shm`.
//!
//! Invariant: a mapping is `len` bytes, zeroed at creation, page-aligned, valid until the
//! [`Segment`] drops; nothing here reads or writes it — its users do, through atomics where
//! processes share words.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::ptr::NonNull;

/// A mapped shared-memory segment (module doc).
pub(crate) struct Segment {
    name: CString,
    base: NonNull<u8>,
    len: usize,
    /// This process made the name and unlinks it (once).
    owner_unlinks: bool,
}

// SAFETY: the mapping is plain memory shared with other processes; this type hands out only its
// base address, and its users synchronize every access across threads and processes (atomics,
// or the plan's proven order).
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn os_error(what: String) -> Error {
    Error::Resource {
        what: format!("{what}: {}", std::io::Error::last_os_error()),
    }
}

impl Segment {
    /// Creates the segment `name` (`/ringreduce-…`, no other slash) of `len` bytes, zeroed, and
    /// maps it. Fails if the name exists.
    pub(crate) fn create(name: &str, len: usize) -> Result<Segment> {
        let cname = CString::new(name).map_err(|_| Error::Internal {
            what: format!("a shared-memory name with a NUL: {name:?}"),
        })?;
        let len = len.max(1);
        // SAFETY: `cname` is a valid NUL-terminated string; the flags and mode are plain ints.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os_error(format!("cannot create shared memory {name}")));
        }
        let close_unlink = || {
            // SAFETY: `fd` is ours and open; the name is ours to remove on failure.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(cname.as_ptr());
            }
        };
        // SAFETY: `fd` is an open shared-memory object; offset 0, a positive length.
        let reserved = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
        if reserved != 0 {
            close_unlink();
            return Err(Error::Resource {
                what: format!(
                    "cannot reserve {len} bytes of shared memory in /dev/shm ({}): the host \
                     ranks of a job with one process per rank exchange data through it; give \
                     /dev/shm more room (a container's is often 64 MB: docker run --shm-size=1g)",
                    std::io::Error::from_raw_os_error(reserved)
                ),
            });
        }
        let segment = Segment::map(fd, &cname, len, true);
        if segment.is_err() {
            // SAFETY: the name is ours; the fd was closed by `map`.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
        segment
    }

    /// Maps the segment `name` a peer created, `len` bytes.
    pub(crate) fn open(name: &str, len: usize) -> Result<Segment> {
        let cname = CString::new(name).map_err(|_| Error::Internal {
            what: format!("a shared-memory name with a NUL: {name:?}"),
        })?;
        // SAFETY: as in `create`.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_error(format!("cannot open shared memory {name}")));
        }
        Segment::map(fd, &cname, len.max(1), false)
    }

    /// Maps `fd` (closed here either way).
    fn map(fd: libc::c_int, name: &CString, len: usize, owner: bool) -> Result<Segment> {
        // SAFETY: a fresh shared, read-write mapping of an open object of at least `len` bytes
        // (created so, or a peer's created so with the same length); the kernel picks the
        // address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        // SAFETY: `fd` is open and ours; the mapping (if made) keeps the object alive.
        unsafe { libc::close(fd) };
        if ptr == libc::MAP_FAILED {
            return Err(os_error(format!(
                "cannot map shared memory {}",
                name.to_string_lossy()
            )));
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| Error::Internal {
            what: "mmap returned null".into(),
        })?;
        Ok(Segment {
            name: name.clone(),
            base,
            len,
            owner_unlinks: owner,
        })
    }

    /// The mapping's first byte (page-aligned).
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The mapping's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Removes the name (the creator, once every peer has mapped it): the memory stays while
    /// mappings do.
    pub(crate) fn unlink(&mut self) {
        if std::mem::take(&mut self.owner_unlinks) {
            // SAFETY: the name is a valid C string; removing a name never touches a mapping.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: `base`/`len` are this mapping's, unmapped once; its users are gone (they
        // borrow the segment or hold the `Arc` that owns it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Whether process `pid` is running (not gone, not a zombie): a peer that died is seen here at
/// once, whether or not its parent has reaped it yet.
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    if unsafe { libc::kill(pid_t, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    // A zombie (killed, not yet reaped) still exists for kill(); /proc says what it is.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat.rsplit_once(')') {
            Some((_, rest)) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(_) => !std::path::Path::new("/proc/self").exists(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_segment_is_shared_between_mappings_and_gone_once_unlinked() {
        let name = format!("/ringreduce-test-{}-shm", std::process::id());
        let mut made = Segment::create(&name, 4096).unwrap();
        assert!(Segment::create(&name, 4096).is_err(), "the name is taken");
        let seen = Segment::open(&name, 4096).unwrap();
        // SAFETY: both mappings are 4096 bytes, page-aligned, alive here.
        let (a, b) = unsafe {
            (
                &*made.base().cast::<AtomicU64>(),
                &*seen.base().cast::<AtomicU64>(),
            )
        };
        assert_eq!(b.load(Ordering::Acquire), 0, "zeroed");
        a.store(42, Ordering::Release);
        assert_eq!(b.load(Ordering::Acquire), 42);
        made.unlink();
        assert!(Segment::open(&name, 4096).is_err(), "the name is gone");
        b.store(7, Ordering::Release);
        assert_eq!(a.load(Ordering::Acquire), 7, "the memory lives on");
    }

    #[test]
    fn a_segment_larger_than_dev_shm_is_a_clear_error() {
        let name = format!("/ringreduce-test-{}-huge", std::process::id());
        let err = Segment::create(&name, 1 << 50)
            .err()
            .expect("1 PiB does not fit");
        assert!(err.to_string().contains("/dev/shm"), "{err}");
        assert!(Segment::open(&name, 1).is_err(), "nothing is left behind");
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(process_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }
}
