#!/usr/bin/env bash
# gpu-suite.sh — the GPU checks of a change, in phases that each fit one device call (≤ 10 min),
# from prebuilt executables in one folder (the GPU host has no Rust toolchain).
#
# Here:   scripts/gpu-pack.sh DIR   (the CLI, every GPU test and this script, packed in
#         DIR/run.tar.xz; carry DIR)
# There:  cd DIR && tar xJf run.tar.xz && bash bin/gpu-suite.sh tests|sanitize|bench|latency OUT_DIR
#
#   tests     the library's unit tests (the device layer's GPU tests), tests/gpu.rs, gpu_graphs.rs, gpu_streams.rs, gpu_user.rs, gpu_collectives.rs,
#             gpu_ll_one_device.rs (SUITE_TESTS="lib gpu_user ..." runs those alone: gpu.rs
#             takes ~6 minutes on one H200, so a device call of ≤ 10 minutes runs it apart)
#   sanitize  compute-sanitizer racecheck and synccheck on gpu_graphs (2 replays) and gpu_streams
#   bench     every collective against the best NCCL configuration (auto), then ringreduce's ring
#             and one-shot forms alone up to 128 MiB, where Auto's per-collective limit is set
#   torch     PyTorch on the GPU (needs a pack made with WHEEL=1 and nccl:gpu_ranks, so that
#             bin/wheels and bin/libringreduce_nccl.so are there): python/tests/gpu_torch.py
#             (the package on CUDA tensors) and nccl/tests/torch_preload.py (torch's nccl backend
#             on the C library, preloaded), each under torch.distributed.run with 2 and 3
#             processes, then examples/python/ at 2
#   nccl      ringreduce-nccl's GPU tests in the pack (nccl:gpu_p2p, nccl:gpu_ranks,
#             nccl:gpu_cudarc), the torch job mesh at 4 processes beside NCCL, then NVIDIA's
#             nccl-tests at 3 and 2 processes under both libraries when NCCL_TESTS_SRC names its
#             source tree (fetched apart, never committed: nccl/tests/nccl_tests.sh builds it)
#   latency   issue 14: the all-reduce 8 B–32 MiB eager and in graphs against every NCCL
#             configuration, random sizes (both placements), the host-phase profile; then
#             launcher threads and the LL one-shot alone up to 1 MiB (both opt-in until this runs);
#             random sizes on the ring, 32–256 MiB
#
# Logs go to OUT_DIR/logs (summary.log has one line per step and its exit code; a test binary's
# line adds its counts of passed, failed, waived and shared-GPU tests (gpu-counts.sh), and the
# phase's totals follow), packed
# into OUT_DIR/logs.tgz at the end. NCCL_NVLS_ENABLE=0 always (NVLink multicast stays off).
# RINGREDUCE_REQUIRE_GPUS is the machine's GPU count (scripts/gpu-counts.sh): a test that needs
# no more GPUs than that fails where it finds fewer, instead of waiving.
set -uo pipefail
phase=${1:?tests|sanitize|bench|latency|torch|nccl}
out=${2:?OUT_DIR}
bin=$(cd "$(dirname "$0")" && pwd)
logs="$out/logs"
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
source "$bin/gpu-counts.sh"
require_gpus
totals=(0 0 0 0)
# One step into its log and one line of summary.log; a test binary's step (test-*, san-*) adds
# its counts to the line, prints it, and adds them to the phase's totals.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS line
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  line="$name rc=$? ${SECONDS}s-${start}s"
  if [[ $name == test-* || $name == san-* ]]; then
    line+=" $(test_counts "$logs/$name.log")"
    echo "$line"
    if [[ $line =~ passed=([0-9]+)\ failed=([0-9]+)\ waived=([0-9]+)\ shared=([0-9]+) ]]; then
      totals=($((totals[0] + BASH_REMATCH[1])) $((totals[1] + BASH_REMATCH[2]))
        $((totals[2] + BASH_REMATCH[3])) $((totals[3] + BASH_REMATCH[4])))
    fi
  fi
  echo "$line" >> "$logs/summary.log"
}
{ date -u; echo "$require_note"; nvidia-smi -L; nvidia-smi topo -m; } > "$logs/env-$phase.log" 2>&1
case $phase in
  tests|sanitize) echo "$phase: $require_note" | tee -a "$logs/summary.log" ;;
esac
case $phase in
  tests)
    for t in ${SUITE_TESTS:-lib gpu_collectives gpu_streams gpu_graphs gpu_user gpu_ll_one_device gpu}; do
      step "test-$t" 420 "$bin/test-$t" --test-threads=1 --nocapture
    done ;;
  sanitize)
    for tool in racecheck synccheck; do
      RINGREDUCE_GRAPH_REPLAYS=2 step "san-$tool-graphs" 150 \
        compute-sanitizer --tool "$tool" "$bin/test-gpu_graphs" --test-threads=1 --nocapture
      step "san-$tool-streams" 120 \
        compute-sanitizer --tool "$tool" "$bin/test-gpu_streams" --test-threads=1 --nocapture
    done ;;
  bench)
    step bench-all 330 "$bin/ringreduce" bench --all -b 8 -e 128M -f 4 --no-staged \
      --json "$logs/bench-all.json"
    for a in ring oneshot; do
      step "bench-$a" 110 "$bin/ringreduce" bench --all -b 8 -e 128M -f 4 --no-staged \
        --no-nccl --algorithm "$a" -n 10 -w 3 --json "$logs/bench-$a.json"
    done ;;
  torch)
    root=$(cd "$bin/../../.." && pwd)
    python3 -m pip install -q --no-index --no-deps --target "$bin/py" "$bin"/wheels/*.whl \
      > "$logs/pip.log" 2>&1
    run=(python3 -m torch.distributed.run --nproc_per_node)
    for n in 2 3; do
      PYTHONPATH=$bin/py step "torch-package-$n" 240 "${run[@]}" "$n" \
        "$root/python/tests/gpu_torch.py"
      LD_PRELOAD=$bin/libringreduce_nccl.so RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1 RINGREDUCE_NCCL_LOG=1 \
        step "torch-preload-$n" 180 "${run[@]}" "$n" "$root/nccl/tests/torch_preload.py"
    done
    for e in ddp_hook tp_mlp_graph; do
      PYTHONPATH=$bin/py step "example-$e" 120 "${run[@]}" 2 "$root/examples/python/$e.py"
    done ;;
  latency)
    step lat-default 300 "$bin/ringreduce" bench -b 8 -e 32M -n 200 -w 20 --graph 10 \
      --sizes random --no-staged --json "$logs/lat-default.json"
    for v in "" launch-threads low-latency; do
      step "lat-profile${v:+-$v}" 45 "$bin/ringreduce" bench -b 8 -e 1M -f 4 -n 200 -w 20 \
        --no-staged --no-nccl --profile-host ${v:+--$v} --json "$logs/lat-profile${v:+-$v}.json"
    done
    for v in launch-threads low-latency; do
      step "lat-$v" 45 "$bin/ringreduce" bench -b 8 -e 1M -n 200 -w 20 --graph 10 --no-staged \
        --no-nccl "--$v" --json "$logs/lat-$v.json"
    done
    # New sizes on the ring (the cell lemma, staging and events per size), ringreduce alone.
    step lat-random-ring 45 "$bin/ringreduce" bench -b 32M -e 256M -n 20 -w 3 --sizes random \
      --random-calls 200 --no-staged --no-nccl --json "$logs/lat-random-ring.json" ;;
  nccl)
    root=$(cd "$bin/../../.." && pwd)
    for t in gpu_p2p gpu_ranks gpu_cudarc; do
      [[ -x $bin/test-nccl-$t ]] || continue
      run=(step "test-nccl-$t" 150 "$bin/test-nccl-$t" --test-threads=1 --nocapture)
      # gpu_p2p under a deadline: a channel that failed to end a mismatch fails, not hangs.
      if [[ $t == gpu_p2p ]]; then
        RINGREDUCE_NCCL_TIMEOUT=40 RINGREDUCE_NCCL_SOURCES=$root/nccl "${run[@]}"
      else
        RINGREDUCE_NCCL_SOURCES=$root/nccl "${run[@]}"
      fi
    done
    TORCH_JOBS=mesh step torch-mesh 150 \
      bash "$root/nccl/tests/torch_jobs.sh" "$bin/libringreduce_nccl.so" "$logs/torch-mesh" 4
    if [[ -n ${NCCL_TESTS_SRC:-} ]]; then
      step nccl-tests 300 bash "$root/nccl/tests/nccl_tests.sh" "$NCCL_TESTS_SRC" \
        "$bin/libringreduce_nccl.so" "$logs/nccl-tests" 3 2
    fi ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
case $phase in
  tests|sanitize)
    echo "$phase total: passed=${totals[0]} failed=${totals[1]} waived=${totals[2]} shared=${totals[3]}" \
      | tee -a "$logs/summary.log" ;;
esac
tar czf "$out/logs.tgz" -C "$out" logs
cat "$logs/summary.log"
