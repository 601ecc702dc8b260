//! The `ringreduce` command as a user meets it: exit codes and messages, run on the built binary.
//!
//! On a host without a GPU (CI, development machines) every GPU command must say so in exactly one
//! line on stderr, starting `ringreduce: no GPU`, and exit with code 3 — never a panic, never a
//! backtrace. Where a GPU is present those assertions do not apply: the tests print a waiver line
//! and pass, they never fake the GPU-less answer. The host-only paths (`run --host`, `info`, a bad
//! flag) are checked everywhere.

use std::process::{Command, Output};

fn ringreduce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringreduce"))
        .args(args)
        // A backtrace would show a panic more loudly; there must be none to show.
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the ringreduce binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `true` when this host has a usable GPU (then the no-GPU assertions are waived).
fn has_gpu() -> bool {
    ringreduce::device::driver_available().is_ok()
}

fn assert_no_panic(what: &str, out: &Output) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        !stdout.contains("panicked") && !stderr.contains("panicked"),
        "{what}: a panic\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        !stderr.contains("stack backtrace"),
        "{what}: a backtrace\nstderr: {stderr}"
    );
}

#[test]
fn gpu_commands_without_a_gpu_say_so_in_one_line_and_exit_3() {
    if has_gpu() {
        eprintln!(
            "gpu_commands_without_a_gpu_say_so_in_one_line_and_exit_3: waived: this host has a GPU"
        );
        return;
    }
    for args in [
        &["topo"][..],
        &["p2p"],
        &["sync"],
        &["tour"],
        &["bench"],
        &["bench", "--processes", "2"],
        &["bench", "--processes", "2", "--registered"],
    ] {
        let command = args.join(" ");
        let command = command.as_str();
        let out = ringreduce(args);
        assert_no_panic(command, &out);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "ringreduce {command}: exit code\nstderr: {stderr}"
        );
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "ringreduce {command}: stderr must be exactly one line, got {stderr:?}"
        );
        assert!(
            lines[0].starts_with("ringreduce: no GPU"),
            "ringreduce {command}: stderr {stderr:?}"
        );
    }
}

#[test]
fn bench_with_processes_measures_the_all_reduce_alone() {
    let out = ringreduce(&["bench", "--processes", "2", "--collective", "all_gather"]);
    assert_no_panic("bench --processes --collective all_gather", &out);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--processes measures the all-reduce"),
        "{stderr}"
    );
}

#[test]
fn registered_buffers_are_a_choice_of_the_processes_bench_only() {
    let out = ringreduce(&["bench", "--registered"]);
    assert_no_panic("bench --registered", &out);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--processes"), "{stderr}");
}

#[test]
fn host_run_works_everywhere() {
    let out = ringreduce(&["run", "--host", "-e", "64K"]);
    assert_no_panic("run --host", &out);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "run --host: exit code\nstdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(stdout.contains("all results correct"), "stdout: {stdout}");
}

#[test]
fn info_works_everywhere() {
    let out = ringreduce(&["info"]);
    assert_no_panic("info", &out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("ringreduce "));
    // How ranks in separate processes share memory, and the room there.
    assert!(
        text(&out.stdout)
            .contains("host ranks in separate processes share memory through: /dev/shm ("),
        "{}",
        text(&out.stdout)
    );
    // Where NCCL is for jobs on several hosts: a file named by RINGREDUCE_NCCL_PATH that does
    // not open is none.
    let out = Command::new(env!("CARGO_BIN_EXE_ringreduce"))
        .arg("info")
        .env("RINGREDUCE_NCCL_PATH", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("between hosts (GPU ranks on several hosts): no NCCL found"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        &["--no-such-flag"][..],
        &["topo", "--no-such-flag"],
        &["p2p", "--iters", "0"],
        &["sync", "--iters", "many"],
        &["run", "-e", "lots"],
    ] {
        let out = ringreduce(args);
        assert_no_panic(&format!("{args:?}"), &out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: exit code\nstderr: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn ring_knobs_reach_host_ranks() {
    let out = ringreduce(&[
        "run",
        "--host",
        "--algorithm",
        "ring",
        "--chunk",
        "4K",
        "--slots",
        "2",
        "-e",
        "64K",
    ]);
    assert_no_panic("run --host --algorithm ring --chunk 4K --slots 2", &out);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "exit code\nstdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains(
            "# algorithm: ring; ring chunk: 4K (1024 f32 elements, --chunk); staging slots per receiver: 2\n"
        ),
        "the preamble must name the knobs used\nstdout: {stdout}"
    );
    assert!(stdout.contains("all results correct"), "stdout: {stdout}");
    // Left out: the host defaults (the pushed two-shot, 1M chunk, 4 slots), said as such.
    let out = ringreduce(&["run", "--host", "-e", "4K"]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "# algorithm: two-shot, its gather pushed; ring chunk: 1M (262144 f32 elements); \
             staging slots per receiver: 4\n"
        ),
        "stdout: {stdout}"
    );
    // Staged edges: the library's rule for them, rows on both sides of its limit, all exact;
    // the two-shot, which reads its peers' buffers, is refused by name.
    let out = ringreduce(&[
        "run",
        "--host",
        "--transport",
        "staged",
        "-b",
        "64K",
        "-e",
        "1M",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}");
    assert!(
        stdout.contains(
            "# algorithm: auto over staged edges: the staged one-shot up to 128K per rank, the \
             ring above;"
        ),
        "stdout: {stdout}"
    );
    assert!(stdout.contains("all results correct"), "stdout: {stdout}");
    let out = ringreduce(&[
        "run",
        "--host",
        "--transport",
        "staged",
        "--algorithm",
        "twoshot",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("staged edges cannot"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn zero_chunk_or_slots_is_a_usage_error() {
    for (args, flag, why) in [
        (&["run", "--chunk", "0"][..], "--chunk", "at least 1 byte"),
        (&["run", "--host", "--slots", "0"], "--slots", "≥ 1"),
        (&["bench", "--chunk", "0"], "--chunk", "at least 1 byte"),
        (
            &["bench", "--chunk", "0M", "--no-nccl"],
            "--chunk",
            "at least 1 byte",
        ),
        (&["bench", "--slots", "0"], "--slots", "≥ 1"),
    ] {
        let out = ringreduce(args);
        assert_no_panic(&format!("{args:?}"), &out);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: exit code\nstderr: {stderr}"
        );
        let first = stderr.lines().next().unwrap_or("");
        assert!(
            first.starts_with("error: invalid value '0")
                && first.contains(flag)
                && first.contains(why),
            "{args:?}: stderr {stderr:?}"
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing may run before the error"
        );
    }
}

#[test]
fn bench_with_knobs_without_a_gpu_says_so_and_exits_3() {
    if has_gpu() {
        eprintln!(
            "bench_with_knobs_without_a_gpu_says_so_and_exits_3: waived: this host has a GPU"
        );
        return;
    }
    let out = ringreduce(&[
        "bench",
        "--chunk",
        "32M",
        "--slots",
        "4",
        "--no-nccl",
        "--no-staged",
    ]);
    assert_no_panic("bench --chunk 32M --slots 4", &out);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr:?}");
    assert!(
        stderr.starts_with("ringreduce: no GPU"),
        "stderr: {stderr:?}"
    );
}

#[test]
fn from_json_reads_reports_with_and_without_the_knobs() {
    let dir = std::env::temp_dir().join(format!("ringreduce-cli-knobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A report from before --chunk/--slots (a real one, committed with the docs): still reads.
    let old = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/runs/2026-11-29-eb7e1c9/bench.json"
    );
    let old_text = std::fs::read_to_string(old).unwrap();
    assert!(!old_text.contains("chunk_bytes") && !old_text.contains("\"slots\""));
    let old_svg = dir.join("old.svg");
    let out = ringreduce(&[
        "bench",
        "--from-json",
        old,
        "--plot",
        old_svg.to_str().unwrap(),
    ]);
    assert_no_panic("--from-json (old report)", &out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let svg = std::fs::read_to_string(&old_svg).unwrap();
    assert!(!svg.contains("chunk "), "an old report names no knobs");
    // The same report as a run with --chunk 32M --slots 4 writes it: the plot's title says so.
    let mut report: serde_json::Value = serde_json::from_str(&old_text).unwrap();
    let fields = report.as_object_mut().unwrap();
    fields.insert("chunk_bytes".into(), (32u64 << 20).into());
    fields.insert("slots".into(), 4.into());
    let new = dir.join("new.json");
    std::fs::write(&new, report.to_string()).unwrap();
    let new_svg = dir.join("new.svg");
    let out = ringreduce(&[
        "bench",
        "--from-json",
        new.to_str().unwrap(),
        "--plot",
        new_svg.to_str().unwrap(),
    ]);
    assert_no_panic("--from-json (report with knobs)", &out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let svg = std::fs::read_to_string(&new_svg).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        svg.contains(", chunk 32M, slots 4"),
        "title of {}",
        new_svg.display()
    );
}

#[test]
fn plan_prints_a_checked_step_table_without_a_gpu() {
    let out = ringreduce(&["plan", "--ranks", "3", "--count", "7"]);
    assert_no_panic("plan --ranks 3 --count 7", &out);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "exit code\nstdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("checked: ok")),
        "stdout: {stdout}"
    );
    for rank in 0..3 {
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.starts_with(&format!("rank {rank}:")))
                .count(),
            1,
            "one line for rank {rank}\nstdout: {stdout}"
        );
    }
    assert!(!stdout.contains("rank 3:"), "stdout: {stdout}");
    for algorithm in ["oneshot", "twoshot"] {
        let out = ringreduce(&["plan", "--algorithm", algorithm, "--in-place"]);
        assert_eq!(out.status.code(), Some(0), "{algorithm}");
        assert!(text(&out.stdout).contains("checked: ok"), "{algorithm}");
    }
}

#[test]
fn plan_draws_its_timeline_as_svg() {
    let dir = std::env::temp_dir().join(format!("ringreduce-cli-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ring.svg");
    let out = ringreduce(&[
        "plan",
        "--ranks",
        "3",
        "--count",
        "7",
        "--chunk",
        "2",
        "--staged",
        "--svg",
        path.to_str().unwrap(),
    ]);
    assert_no_panic("plan --svg", &out);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("rank 2 recv"), "a lane per (rank, stream)");
}

#[test]
fn plan_refuses_bad_input_clearly() {
    for (args, needle) in [
        (&["plan", "--ranks", "0"][..], "--ranks"),
        (&["plan", "--chunk", "0"], "--chunk"),
        (&["plan", "--algorithm", "auto"], "ring, oneshot or twoshot"),
        (&["plan", "--algorithm", "twoshot", "--staged"], "ring only"),
    ] {
        let out = ringreduce(args);
        assert_no_panic(&format!("{args:?}"), &out);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: exit code\nstderr: {stderr}"
        );
        assert!(stderr.contains(needle), "{args:?}: stderr {stderr:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing printed");
    }
    // A shape the builder refuses: the builder's reason, exit code 1.
    let out = ringreduce(&["plan", "--algorithm", "twoshot", "--ranks", "65"]);
    assert_no_panic("plan twoshot 65 ranks", &out);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with("ringreduce: the plan could not be built"));
}

#[test]
fn launch_sets_torchruns_variables_and_succeeds_when_every_rank_does() {
    let script = r#"test "$WORLD_SIZE" = 3 && test "$LOCAL_WORLD_SIZE" = 3 && test "$RANK" = "$LOCAL_RANK" && test "$MASTER_ADDR" = 127.0.0.1 && test -n "$MASTER_PORT" && test -n "$TORCHELASTIC_RUN_ID" && test "$CUDA_VISIBLE_DEVICES" = "$((RANK + 4))""#;
    let out = ringreduce(&[
        "launch", "-n", "3", "--gpus", "4,5,6", "--", "sh", "-c", script,
    ]);
    assert_no_panic("launch", &out);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn launch_numbers_the_ranks_of_each_host_of_a_job_on_several() {
    // The second of two hosts (one machine standing in for it): ranks 3..6 of 6.
    let script = r#"test "$WORLD_SIZE" = 6 && test "$LOCAL_WORLD_SIZE" = 3 && test "$RANK" = "$((LOCAL_RANK + 3))" && test "$GROUP_RANK" = 1 && test "$MASTER_ADDR" = 10.0.0.1 && test "$MASTER_PORT" = 29500 && test "$RINGREDUCE_HOST_ID" = b && test "$TORCHELASTIC_RUN_ID" = ringreduce-launch-10.0.0.1-29500"#;
    let out = ringreduce(&[
        "launch",
        "-n",
        "3",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29500",
        "--host-id",
        "b",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_no_panic("launch", &out);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Several hosts need the first host's address and port on every launcher.
    for args in [
        &[
            "launch",
            "-n",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--",
            "true",
        ][..],
        &[
            "launch",
            "-n",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-addr",
            "a",
            "--master-port",
            "1",
            "--",
            "true",
        ][..],
    ] {
        let out = ringreduce(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // A failing rank is named by its job rank.
    let out = ringreduce(&[
        "launch",
        "-n",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        r#"exit $((RANK == 3))"#,
    ]);
    assert!(
        text(&out.stderr).contains("rank 3 exited with code 1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn launch_stops_the_job_and_names_the_rank_that_failed() {
    // Rank 1 fails at once; the others would run for a minute.
    let script = r#"if [ "$RANK" = 1 ]; then exit 7; fi; sleep 60"#;
    let started = std::time::Instant::now();
    let out = ringreduce(&[
        "launch", "-n", "3", "--grace", "2", "--", "sh", "-c", script,
    ]);
    assert_no_panic("launch", &out);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("rank 1 exited with code 7"), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the other ranks were not stopped: {:?}",
        started.elapsed()
    );
    // --gpus must name one GPU per rank.
    let out = ringreduce(&["launch", "-n", "2", "--gpus", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn a_stopped_launcher_stops_every_rank() {
    let dir = std::env::temp_dir().join(format!("ringreduce-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(r#"echo $$ > {}/$RANK; sleep 60"#, dir.display());
    let launcher = Command::new(env!("CARGO_BIN_EXE_ringreduce"))
        .args(["launch", "-n", "2", "--", "sh", "-c", &script])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid_of = |rank: usize| std::fs::read_to_string(dir.join(rank.to_string())).ok();
    let started = std::time::Instant::now();
    while (pid_of(0).is_none() || pid_of(1).is_none())
        && started.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pids: Vec<String> = (0..2)
        .map(|r| pid_of(r).unwrap().trim().to_string())
        .collect();
    Command::new("kill")
        .args(["-INT", &launcher.id().to_string()])
        .status()
        .unwrap();
    let out = launcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("stopped by signal 2"),
        "{}",
        text(&out.stderr)
    );
    for pid in pids {
        let alive = Command::new("kill")
            .args(["-0", &pid])
            .status()
            .unwrap()
            .success();
        assert!(!alive, "rank process {pid} outlived the launcher");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
