//! `ringreduce launch -n N [--gpus LIST] -- PROGRAM ARGS…`: starts N processes of one job on this
//! host, as torchrun does, and watches them.
//!
//! Each process gets torchrun's variables — `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR` (127.0.0.1), `MASTER_PORT`, `TORCHELASTIC_RUN_ID` — and,
//! with `--gpus 0,1`, `CUDA_VISIBLE_DEVICES` set to its GPU (so each process sees one GPU, as
//! ordinal 0). `RankCommunicator::from_env_host` (or torch's `init_process_group`) reads them.
//! `MASTER_PORT` and the next port are free ports picked here (ringreduce's rendezvous listens on
//! `MASTER_PORT + 1`).
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
    catch_stop_signals();
    let port = free_ports()?;
    let run_id = format!("ringreduce-launch-{}-{port}", std::process::id());
    let (program, program_args) = args
        .program
        .split_first()
        .ok_or_else(|| Failure::Usage("no program to launch (give it after --)".into()))?;
    let mut children: Vec<Option<Child>> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(program_args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", &run_id);
        if let Some(gpus) = &args.gpus {
            cmd.env("CUDA_VISIBLE_DEVICES", gpus[rank].to_string());
        }
        // Each rank leads a process group of its own, so that stopping it stops whatever it
        // started too (a shell's children, a data loader's workers).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        match cmd.spawn() {
            Ok(child) => children.push(Some(child)),
            Err(e) => {
                stop(&mut children, Duration::from_secs(args.grace));
                return Err(Failure::Failed(format!(
                    "cannot start rank {rank} ({program}): {e}"
                )));
            }
        }
    }
    // Watch every rank; the first that fails stops the job.
    let mut left = n;
    while left > 0 {
        let signal = STOP.load(Ordering::SeqCst);
        if signal != 0 {
            stop(&mut children, Duration::from_secs(args.grace));
            return Err(Failure::Failed(format!(
                "stopped by signal {signal}; every rank was stopped"
            )));
        }
        for rank in 0..n {
            let Some(child) = children[rank].as_mut() else {
                continue;
            };
            let status = child
                .try_wait()
                .map_err(|e| Failure::Failed(format!("cannot watch rank {rank}: {e}")))?;
            let Some(status) = status else { continue };
            children[rank] = None;
            left -= 1;
            if !status.success() {
                stop(&mut children, Duration::from_secs(args.grace));
                return Err(Failure::Failed(format!(
                    "rank {rank} {}; the other ranks were stopped",
                    describe(status)
                )));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Sends `signal` to the process group rank `child` leads (kill(1): std's `Child::kill` sends
/// SIGKILL to the leader alone).
fn signal_group(child: &Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, "--", &format!("-{}", child.id())])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Stops every rank still running, with what it started: SIGTERM to each rank's process group,
/// then SIGKILL to the groups still there after `grace`.
fn stop(children: &mut [Option<Child>], grace: Duration) {
    for child in children.iter().flatten() {
        signal_group(child, "-TERM");
    }
    let deadline = Instant::now() + grace;
    for slot in children.iter_mut() {
        let Some(child) = slot.as_mut() else { continue };
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    signal_group(child, "-KILL");
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        // What the rank started may outlive it: its group goes too.
        signal_group(child, "-KILL");
        *slot = None;
    }
}
