//! `ringreduce launch -n N [--gpus LIST] -- PROGRAM ARGS…`: starts N processes of one job on this
//! host, as torchrun does, and watches them.
//!
//! Each process gets torchrun's variables — `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR` (127.0.0.1), `MASTER_PORT`,
//! `TORCHELASTIC_RUN_ID` — and, with `--gpus 0,1`, `CUDA_VISIBLE_DEVICES` set to its GPU (so each
//! process sees one GPU, as ordinal 0). `RankCommunicator::from_env_host` (or torch's
//! `init_process_group`) reads them. `MASTER_PORT` and the next port are free ports picked here
//! (ringreduce's rendezvous listens on `MASTER_PORT + 1`).
//!
//! A job on several hosts runs one launcher per host, as `torchrun --nnodes`: each with the
//! same `--nnodes H`, `--master-addr` (the first host's address) and `--master-port` (free there,
//! with the port after it), and its own `--node-rank` (0 on the first host). Host h's ranks are
//! `h·N .. (h+1)·N` of a world of `H·N` (torchrun's numbering, which the hierarchical
//! collectives need), and `TORCHELASTIC_RUN_ID` is derived from the master's address and port so
//! that every host's ranks agree on it. `--host-id` sets `RINGREDUCE_HOST_ID`, the host name each
//! rank reports: two launchers on one machine with different ids stand in for two hosts. Each
//! launcher watches its own host's ranks; a rank lost on another host reaches these through the
//! collectives' own errors.
//!
//! Invariant: the launcher exits 0 only when every rank did; when one rank exits non-zero or is
//! killed, the others are stopped (SIGTERM to each rank's process group, then SIGKILL after a
//! grace period) and the launcher exits 1 naming that rank — a job never hangs on a dead rank.
//! Stopping the launcher (Ctrl-C, SIGTERM) stops every rank the same way.

use crate::Failure;
use clap::Args;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Number of processes (ranks).
    #[arg(short = 'n', long = "nproc", value_parser = crate::parse_positive)]
    pub nproc: usize,
    /// One GPU per rank, by ordinal (e.g. `0,1`): each rank's `CUDA_VISIBLE_DEVICES`.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<usize>>,
    /// Hosts in the job (one launcher runs on each).
    #[arg(long, default_value_t = 1, value_parser = crate::parse_positive)]
    pub nnodes: usize,
    /// This host's index among the job's hosts, from 0.
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// The first host's address (several hosts: required; one: 127.0.0.1).
    #[arg(long)]
    pub master_addr: Option<String>,
    /// A free port on the first host, with the port after it (several hosts: required; one:
    /// picked here).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// The host name every rank of this launcher reports (`RINGREDUCE_HOST_ID`).
    #[arg(long)]
    pub host_id: Option<String>,
    /// How long the other ranks get to stop after one failed, in seconds, before SIGKILL.
    #[arg(long, default_value_t = 5)]
    pub grace: u64,
    /// The program and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub program: Vec<String>,
}

/// Set when the launcher is asked to stop (SIGINT, SIGTERM, SIGHUP): it stops the job.
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    STOP.store(signal, Ordering::SeqCst);
}

/// Routes the signals that end a launcher to [`on_signal`]: the ranks lead process groups of
/// their own, so a Ctrl-C in the terminal reaches the launcher alone, which stops them.
fn catch_stop_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` only stores into an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Two consecutive free ports on 127.0.0.1 (`MASTER_PORT` for the job's own store, the next
/// for ringreduce's rendezvous), found by binding them.
fn free_ports() -> Result<u16, Failure> {
    for _ in 0..64 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Failure::Failed(format!("cannot find a free port: {e}")))?
            .port();
        if first < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", first + 1)).is_ok() {
            return Ok(first);
        }
    }
    Err(Failure::Failed(
        "cannot find two free ports in a row".into(),
    ))
}

/// What a rank's end says, for people.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => "ended".into(),
    }
}

pub fn run(args: &LaunchArgs) -> Result<(), Failure> {
    let n = args.nproc;
    if let Some(gpus) = &args.gpus {
        if gpus.len() != n {
            return Err(Failure::Usage(format!(
                "--gpus names {} GPU(s) for {n} rank(s): name one per rank",
                gpus.len()
            )));
        }
    }
    let (nnodes, node) = (args.nnodes, args.node_rank);
    if node >= nnodes {
        return Err(Failure::Usage(format!(
            "--node-rank {node} of --nnodes {nnodes}: a host's index is below the number of hosts"
        )));
    }
    let (addr, port) = match (nnodes, &args.master_addr, args.master_port) {
        (1, addr, port) => (
            addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
            match port {
                Some(p) => p,
                None => free_ports()?,
            },
        ),
        (_, Some(addr), Some(port)) => (addr.clone(), port),
        _ => {
            return Err(Failure::Usage(format!(
                "--nnodes {nnodes}: every host's launcher needs the same --master-addr (the \
                 first host's address) and --master-port (free there, with the port after it)"
            )))
        }
    };
    catch_stop_signals();
    let run_id = match nnodes {
        1 => format!("ringreduce-launch-{}-{port}", std::process::id()),
        _ => format!("ringreduce-launch-{addr}-{port}"),
    };
    let (program, program_args) = args
        .program
        .split_first()
        .ok_or_else(|| Failure::Usage("no program to launch (give it after --)".into()))?;
    // One waiter thread per rank reaps it and reports in the order the ranks end, so the
    // rank named is the first to fail, not the first looked at.
    let (ended_tx, ended) = std::sync::mpsc::channel::<(usize, std::io::Result<ExitStatus>)>();
    let mut pids: Vec<Option<u32>> = Vec::with_capacity(n);
    for local in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(program_args)
            .env("RANK", (node * n + local).to_string())
            .env("WORLD_SIZE", (nnodes * n).to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("GROUP_RANK", node.to_string())
            .env("MASTER_ADDR", &addr)
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", &run_id);
        if let Some(host) = &args.host_id {
            cmd.env("RINGREDUCE_HOST_ID", host);
        }
        let rank = local;
        if let Some(gpus) = &args.gpus {
            cmd.env("CUDA_VISIBLE_DEVICES", gpus[rank].to_string());
        }
        // Each rank leads a process group of its own, so that stopping it stops whatever it
        // started too (a shell's children, a data loader's workers).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        match cmd.spawn() {
            Ok(child) => {
                pids.push(Some(child.id()));
                let tx = ended_tx.clone();
                std::thread::spawn(move || watch(rank, child, tx));
            }
            Err(e) => {
                stop(&mut pids, &ended, Duration::from_secs(args.grace));
                return Err(Failure::Failed(format!(
                    "cannot start rank {} ({program}): {e}",
                    node * n + rank
                )));
            }
        }
    }
    // The first rank to fail stops the job; so does a signal to the launcher.
    while pids.iter().any(Option::is_some) {
        let signal = STOP.load(Ordering::SeqCst);
        if signal != 0 {
            stop(&mut pids, &ended, Duration::from_secs(args.grace));
            return Err(Failure::Failed(format!(
                "stopped by signal {signal}; every rank was stopped"
            )));
        }
        let Ok((rank, status)) = ended.recv_timeout(Duration::from_millis(10)) else {
            continue;
        };
        pids[rank] = None;
        let failed = match status {
            Ok(status) if status.success() => continue,
            Ok(status) => describe(status),
            Err(e) => format!("could not be watched ({e})"),
        };
        stop(&mut pids, &ended, Duration::from_secs(args.grace));
        return Err(Failure::Failed(format!(
            "rank {} {failed}; the other ranks were stopped",
            node * n + rank
        )));
    }
    Ok(())
}

/// Reaps rank `rank`, stops what it left behind in its process group, and reports.
fn watch(
    rank: usize,
    mut child: Child,
    ended: std::sync::mpsc::Sender<(usize, std::io::Result<ExitStatus>)>,
) {
    let pid = child.id();
    let status = child.wait();
    // Right after the leader is reaped its group id cannot belong to anyone else while a
    // member is left; an empty group makes this a no-op.
    signal_group(pid, "-KILL");
    let _ = ended.send((rank, status));
}

/// Sends `signal` to the process group rank `pid` leads (kill(1): std's `Child::kill` sends
/// SIGKILL to the leader alone).
fn signal_group(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, "--", &format!("-{pid}")])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Stops every rank still running (`pids`' entries not yet reported ended), with what it
/// started: SIGTERM to each one's process group, then SIGKILL to the groups still there after
/// `grace`; returns once every rank has been reaped.
fn stop(
    pids: &mut [Option<u32>],
    ended: &std::sync::mpsc::Receiver<(usize, std::io::Result<ExitStatus>)>,
    grace: Duration,
) {
    for pid in pids.iter().flatten() {
        signal_group(*pid, "-TERM");
    }
    let deadline = Instant::now() + grace;
    let mut killed = false;
    while pids.iter().any(Option::is_some) {
        if !killed && Instant::now() >= deadline {
            for pid in pids.iter().flatten() {
                signal_group(*pid, "-KILL");
            }
            killed = true;
        }
        if let Ok((rank, _)) = ended.recv_timeout(Duration::from_millis(10)) {
            pids[rank] = None;
        }
    }
}
