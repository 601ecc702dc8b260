//! `NcclStandIn`: a test double of NCCL's collectives between hosts, for host ranks of a job on
//! several hosts (`RankCommunicator::host_across`). Used only by tests: on GPUs, NCCL itself
//! runs the stages across hosts.
//!
//! A star over TCP on 127.0.0.1: the group's member 0 listens, every member sends it each call's
//! header and data, member 0 checks that the headers agree, computes every member's result by
//! NCCL's definition of the collective (in place, for a world of the group's size; all-to-all
//! from a separate input) and sends each its own. Reductions fold in member order with the
//! library's own `Element::combine` (what NCCL's ops mean on these types). Every read has a
//! deadline; a lost member (its socket closed, as when its process dies or it aborts) is
//! `RankFailed` naming it by its index in the group; mismatched headers are `CallMismatch`.

use ringreduce::plan::{Collective, Transfer};
use ringreduce::{DType, Element, Error, InterHost, InterHostFactory, ReduceOp, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Makes the stand-in's groups (module doc); `timeout` bounds every wait.
pub struct NcclStandIn {
    pub timeout: Duration,
}

/// Listeners made by `new_id` in this process, by port, for member 0 to take.
fn listeners() -> &'static Mutex<HashMap<u16, TcpListener>> {
    static L: OnceLock<Mutex<HashMap<u16, TcpListener>>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lost(index: usize, e: impl std::fmt::Display) -> Error {
    Error::RankFailed {
        rank: index,
        during: "a collective across hosts (NCCL stand-in)".into(),
        message: format!("its connection failed: {e}"),
    }
}

impl InterHostFactory for NcclStandIn {
    fn new_id(&self) -> Result<Vec<u8>> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Resource {
            what: format!("stand-in: {e}"),
        })?;
        let port = listener.local_addr().unwrap().port();
        listeners().lock().unwrap().insert(port, listener);
        Ok(port.to_le_bytes().to_vec())
    }

    fn join(&self, id: &[u8], index: usize, size: usize) -> Result<Box<dyn InterHost>> {
        let port = u16::from_le_bytes([id[0], id[1]]);
        let deadline = Instant::now() + self.timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        if index == 0 {
            let listener = listeners().lock().unwrap().remove(&port).unwrap();
            listener.set_nonblocking(true).unwrap();
            while peers.iter().skip(1).any(Option::is_none) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(self.timeout)).unwrap();
                        let mut w = [0u8; 8];
                        s.read_exact(&mut w).map_err(|e| lost(0, e))?;
                        let q = u64::from_le_bytes(w) as usize;
                        peers[q] = Some(s);
                    }
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(_) => {
                        let q = peers.iter().skip(1).position(Option::is_none).unwrap() + 1;
                        return Err(Error::Timeout {
                            rank: q,
                            waiting_on: "joining the NCCL stand-in".into(),
                            after: self.timeout,
                        });
                    }
                }
            }
        } else {
            let mut s = loop {
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => return Err(lost(0, e)),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            };
            s.set_read_timeout(Some(self.timeout)).unwrap();
            s.write_all(&(index as u64).to_le_bytes())
                .map_err(|e| lost(0, e))?;
            peers[0] = Some(s);
        }
        Ok(Box::new(Member { index, peers }))
    }
}

/// One member's connections: member 0 to every other, the others to member 0.
struct Member {
    index: usize,
    peers: Vec<Option<TcpStream>>,
}

fn send(s: &mut TcpStream, header: &[u64], data: &[&[u8]]) -> std::io::Result<()> {
    let mut bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
    for d in data {
        bytes.extend_from_slice(d);
    }
    s.write_all(&bytes)
}

fn recv_words(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<u64>> {
    let mut bytes = vec![0u8; n * 8];
    s.read_exact(&mut bytes)?;
    Ok(bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

fn recv_bytes(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; n];
    s.read_exact(&mut bytes)?;
    Ok(bytes)
}

const HEADER: usize = 7;

fn header(
    c: &Collective,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    input: usize,
    buf: usize,
) -> Vec<u64> {
    let (kind, root) = match *c {
        Collective::AllReduce => (1, 0),
        Collective::ReduceScatter => (2, 0),
        Collective::AllGather => (3, 0),
        Collective::Broadcast { root } => (4, root),
        Collective::Reduce { root } => (5, root),
        Collective::AllToAll => (6, 0),
        Collective::SendRecv { .. } => (7, 0),
    };
    let dt = DType::ALL.iter().position(|d| *d == dtype).unwrap();
    let o = ReduceOp::ALL.iter().position(|x| *x == op).unwrap();
    vec![
        kind,
        root as u64,
        count as u64,
        dt as u64,
        o as u64,
        input as u64,
        buf as u64,
    ]
}

impl InterHost for Member {
    fn collective(
        &mut self,
        collective: &Collective,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        input: Option<&[u8]>,
        buf: &mut [u8],
    ) -> Result<()> {
        let ours = header(
            collective,
            count,
            dtype,
            op,
            input.map_or(0, <[u8]>::len),
            buf.len(),
        );
        if self.index != 0 {
            let s = self.peers[0].as_mut().ok_or_else(|| lost(0, "aborted"))?;
            send(s, &ours, &[input.unwrap_or(&[]), buf]).map_err(|e| lost(0, e))?;
            let status = recv_words(s, 1).map_err(|e| lost(0, e))?[0];
            if status != 0 {
                return Err(Error::CallMismatch {
                    rank: status as usize - 1,
                    theirs: "another collective".into(),
                    this: self.index,
                    ours: format!("{} of {count}", collective.name()),
                });
            }
            let result = recv_bytes(s, buf.len()).map_err(|e| lost(0, e))?;
            buf.copy_from_slice(&result);
            return Ok(());
        }
        let k = self.peers.len();
        let mut inputs = vec![input.unwrap_or(&[]).to_vec()];
        let mut bufs = vec![buf.to_vec()];
        let mut differs = None;
        for q in 1..k {
            let s = self.peers[q].as_mut().ok_or_else(|| lost(q, "aborted"))?;
            let theirs = recv_words(s, HEADER).map_err(|e| lost(q, e))?;
            inputs.push(recv_bytes(s, theirs[5] as usize).map_err(|e| lost(q, e))?);
            bufs.push(recv_bytes(s, theirs[6] as usize).map_err(|e| lost(q, e))?);
            if theirs != ours {
                differs.get_or_insert(q);
            }
        }
        if let Some(q) = differs {
            for s in self.peers.iter_mut().skip(1).flatten() {
                let _ = send(s, &[q as u64 + 1], &[]);
            }
            return Err(Error::CallMismatch {
                rank: q,
                theirs: "another collective".into(),
                this: 0,
                ours: format!("{} of {count}", collective.name()),
            });
        }
        let results = match dtype {
            DType::F32 => compute::<f32>(collective, count, op, &inputs, &bufs),
            DType::F64 => compute::<f64>(collective, count, op, &inputs, &bufs),
            DType::I32 => compute::<i32>(collective, count, op, &inputs, &bufs),
            DType::I64 => compute::<i64>(collective, count, op, &inputs, &bufs),
            DType::U64 => compute::<u64>(collective, count, op, &inputs, &bufs),
            DType::U8 => compute::<u8>(collective, count, op, &inputs, &bufs),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "the NCCL stand-in does not take {other}"
                )))
            }
        };
        for (q, s) in self.peers.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().ok_or_else(|| lost(q, "aborted"))?;
            send(s, &[0], &[&results[q]]).map_err(|e| lost(q, e))?;
        }
        buf.copy_from_slice(&results[0]);
        Ok(())
    }

    fn send_recv(
        &mut self,
        transfers: &[Transfer],
        dtype: DType,
        sends: &[&[u8]],
        recvs: &mut [&mut [u8]],
    ) -> Result<()> {
        let eb = dtype.size_bytes();
        let folded = transfers.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, t| {
            [t.from, t.to, t.count]
                .iter()
                .fold(h, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
        });
        let dt = DType::ALL.iter().position(|d| *d == dtype).unwrap() as u64;
        let sent: Vec<u8> = sends.concat();
        let ours = vec![
            8,
            folded,
            transfers.len() as u64,
            dt,
            0,
            sent.len() as u64,
            0,
        ];
        if self.index != 0 {
            let s = self.peers[0].as_mut().ok_or_else(|| lost(0, "aborted"))?;
            send(s, &ours, &[&sent]).map_err(|e| lost(0, e))?;
            let status = recv_words(s, 1).map_err(|e| lost(0, e))?[0];
            if status != 0 {
                return Err(Error::CallMismatch {
                    rank: status as usize - 1,
                    theirs: "other transfers".into(),
                    this: self.index,
                    ours: "send/recv".into(),
                });
            }
            for r in recvs.iter_mut() {
                let got = recv_bytes(s, r.len()).map_err(|e| lost(0, e))?;
                r.copy_from_slice(&got);
            }
            return Ok(());
        }
        // Member 0 gathers every member's send buffers, then hands each transfer to its receiver.
        let k = self.peers.len();
        let mut outgoing = vec![sent];
        for q in 1..k {
            let s = self.peers[q].as_mut().ok_or_else(|| lost(q, "aborted"))?;
            let theirs = recv_words(s, HEADER).map_err(|e| lost(q, e))?;
            outgoing.push(recv_bytes(s, theirs[5] as usize).map_err(|e| lost(q, e))?);
            if theirs[..4] != ours[..4] {
                for s in self.peers.iter_mut().skip(1).flatten() {
                    let _ = send(s, &[q as u64 + 1], &[]);
                }
                return Err(Error::CallMismatch {
                    rank: q,
                    theirs: "other transfers".into(),
                    this: 0,
                    ours: "send/recv".into(),
                });
            }
        }
        let mut read_at = vec![0usize; k];
        let mut incoming: Vec<Vec<u8>> = vec![Vec::new(); k];
        for t in transfers {
            let bytes = t.count * eb;
            let at = read_at[t.from];
            incoming[t.to].extend_from_slice(&outgoing[t.from][at..at + bytes]);
            read_at[t.from] += bytes;
        }
        for (q, s) in self.peers.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().ok_or_else(|| lost(q, "aborted"))?;
            send(s, &[0], &[&incoming[q]]).map_err(|e| lost(q, e))?;
        }
        let mut at = 0;
        for r in recvs.iter_mut() {
            let n = r.len();
            r.copy_from_slice(&incoming[0][at..at + n]);
            at += n;
        }
        Ok(())
    }

    fn abort(&mut self) {
        for s in self.peers.iter_mut().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Every member's buffer after `collective` by NCCL's definition (module doc).
fn compute<T: Element>(
    collective: &Collective,
    count: usize,
    op: ReduceOp,
    inputs: &[Vec<u8>],
    bufs: &[Vec<u8>],
) -> Vec<Vec<u8>> {
    let k = bufs.len();
    let typed = |b: &Vec<u8>| -> Vec<T> { bytemuck::pod_collect_to_vec(b) };
    let ins: Vec<Vec<T>> = inputs.iter().map(typed).collect();
    let mut out: Vec<Vec<T>> = bufs.iter().map(typed).collect();
    let fold = |src: &[Vec<T>], at: usize| -> Vec<T> {
        (0..count)
            .map(|e| (1..k).fold(src[0][at + e], |acc, q| T::combine(op, acc, src[q][at + e])))
            .collect()
    };
    let before = out.clone();
    match *collective {
        Collective::AllReduce => {
            let sum = fold(&before, 0);
            out.iter_mut().for_each(|o| o.copy_from_slice(&sum));
        }
        Collective::ReduceScatter => {
            for (i, o) in out.iter_mut().enumerate() {
                o[i * count..(i + 1) * count].copy_from_slice(&fold(&before, i * count));
            }
        }
        Collective::AllGather => {
            for o in out.iter_mut() {
                for (j, b) in before.iter().enumerate() {
                    o[j * count..(j + 1) * count].copy_from_slice(&b[j * count..(j + 1) * count]);
                }
            }
        }
        Collective::Broadcast { root } => {
            out.iter_mut()
                .for_each(|o| o.copy_from_slice(&before[root]));
        }
        Collective::Reduce { root } => {
            let sum = fold(&before, 0);
            out[root].copy_from_slice(&sum);
        }
        Collective::AllToAll => {
            for (r, o) in out.iter_mut().enumerate() {
                for (j, i) in ins.iter().enumerate() {
                    o[j * count..(j + 1) * count].copy_from_slice(&i[r * count..(r + 1) * count]);
                }
            }
        }
        Collective::SendRecv { .. } => {}
    }
    out.iter()
        .map(|o| bytemuck::cast_slice(o).to_vec())
        .collect()
}
