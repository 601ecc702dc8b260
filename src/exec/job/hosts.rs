//! The hosts of a job: how the ranks a rendezvous met lie on hosts ([`host_layout`]), what a
//! rank across hosts (`exec::hierarchy`) is laid out by, and the rule every layout keeps
//! ([`layout_of`]: torchrun's numbering).

use crate::error::{Error, Result};
use crate::exec::rendezvous::{push_text, text_of, Rendezvous};
use crate::plan::hierarchy::Hosts;

/// How the ranks `rendezvous` met lie on hosts: every rank reports its host ([`host_id`]) and
/// judges every rank's report alike ([`layout_of`]), so every rank returns the same layout or
/// the same [`Error::HostLayout`].
pub(crate) fn host_layout(rendezvous: &mut Rendezvous) -> Result<Hosts> {
    let mut record = Vec::new();
    push_text(&mut record, &host_id());
    let names: Vec<String> = rendezvous
        .all_gather(&record)?
        .iter()
        .map(|r| match r.split_first() {
            Some((len, words)) => text_of(*len as usize, words),
            None => String::new(),
        })
        .collect();
    layout_of(&names)
}

/// The layout of ranks whose hosts are `names` (by rank): hosts in the order of their first
/// rank, each host's ranks consecutive, as many on every host (torchrun's numbering).
pub(crate) fn layout_of(names: &[String]) -> Result<Hosts> {
    let mut hosts: Vec<(&str, Vec<usize>)> = Vec::new();
    for (rank, name) in names.iter().enumerate() {
        match hosts.iter_mut().find(|h| h.0 == name) {
            Some(h) => h.1.push(rank),
            None => hosts.push((name, vec![rank])),
        }
    }
    let local = hosts.first().map_or(0, |h| h.1.len());
    for (h, (name, ranks)) in hosts.iter().enumerate() {
        if ranks.len() != local {
            return Err(Error::HostLayout {
                what: format!(
                    "host {name:?} has {} ranks ({ranks:?}) and host {:?} has {local}: every \
                     host must run as many",
                    ranks.len(),
                    hosts[0].0
                ),
            });
        }
        if ranks
            .iter()
            .ne(&(h * local..(h + 1) * local).collect::<Vec<_>>())
        {
            return Err(Error::HostLayout {
                what: format!(
                    "host {name:?} runs ranks {ranks:?}: each host's ranks must be consecutive \
                     (torchrun's numbering: rank = node rank × ranks per node + local rank)"
                ),
            });
        }
    }
    Ok(Hosts {
        hosts: hosts.len(),
        local,
    })
}

/// The host this rank reports: `RINGREDUCE_HOST_ID` when set (so that one machine can stand in
/// for several), else the host name.
fn host_id() -> String {
    if let Ok(id) = std::env::var("RINGREDUCE_HOST_ID") {
        return id;
    }
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is 256 writable bytes and that is the length passed; the result is
    // NUL-terminated within it on success (truncated names are not NUL-terminated: the last
    // byte is forced to 0 below).
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len() - 1);
    match ok {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "unknown host".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hosts_group_consecutive_ranks_alike() {
        let hosts = layout_of(&names(&["a", "a", "b", "b", "c", "c"])).unwrap();
        assert_eq!((hosts.hosts, hosts.local), (3, 2));
        assert_eq!(
            layout_of(&names(&["x"; 5])).unwrap(),
            Hosts { hosts: 1, local: 5 }
        );
    }

    #[test]
    fn interleaved_or_uneven_hosts_are_named() {
        let e = layout_of(&names(&["a", "b", "a", "b"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host \"a\" runs ranks [0, 2]") && e.contains("consecutive"),
            "{e}"
        );
        let e = layout_of(&names(&["a", "a", "a", "b"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host \"b\" has 1 ranks ([3])") && e.contains("as many"),
            "{e}"
        );
    }
}
