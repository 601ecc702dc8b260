#!/usr/bin/env bash
# gpu-check.sh — run the GPU test suite and a short benchmark on a GPU host from prebuilt
# executables (a GPU host may have no Rust toolchain).
#
# Here (any machine with Rust):   scripts/stage.sh                # builds into .gpu/bin/
# There (the GPU host):           scripts/gpu-check.sh [OUT_DIR]
#
# Writes logs to OUT_DIR (default ./gpu-check-out): environment, GPU tests, `ringreduce info`
# and `ringreduce run`, and summary.log, one line per step (the GPU tests' with their counts of
# passed, failed and waived tests). RINGREDUCE_REQUIRE_GPUS is the machine's GPU count
# (scripts/gpu-counts.sh): a test that needs no more GPUs than that fails where it finds fewer,
# instead of waiving. Exits non-zero if any step fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.gpu/bin"
out=${1:-$root/gpu-check-out}
mkdir -p "$out"
source "$root/scripts/gpu-counts.sh"
require_gpus
: > "$out/summary.log"
status=0
step() {
  local name=$1; shift
  local verdict=ok
  echo "== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log" || { verdict=FAILED; status=1; }
  [[ $name == test-* ]] && verdict+=" $(test_counts "$out/$name.log")"
  echo "== $name: $verdict"
  echo "$name $verdict" >> "$out/summary.log"
}
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "$require_note"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "commit: unknown (no git)"
} > "$out/env.log" 2>&1
cat "$out/env.log"
[[ -x "$bin/ringreduce" ]] || { echo "no $bin/ringreduce: run scripts/stage.sh first"; exit 2; }
step info "$bin/ringreduce" info
step test-gpu timeout "${TEST_TIMEOUT:-480}" "$bin/test-gpu" --test-threads=1 --nocapture
step run timeout "${RUN_TIMEOUT:-100}" "$bin/ringreduce" run
exit $status
