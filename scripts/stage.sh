#!/usr/bin/env bash
# stage.sh — build every release executable a GPU host without a Rust toolchain will run, and
# put them in .gpu/bin/ at the project root (kept out of git through .git/info/exclude).
#
#   scripts/stage.sh                        # the CLI, the examples, every test and bench executable
#   eval "$(bash .ci/install-nvcc.sh --export)"; scripts/stage.sh   # with the kernels embedded
#   STAGE_KEEP_DEBUG=1 scripts/stage.sh     # keep debug info (stripped otherwise, to fit a transfer)
#
# Names in .gpu/bin: binaries keep theirs (`ringreduce`), examples become example-NAME, test
# executables test-TARGET (test-ringreduce: the library's unit tests), benches bench-TARGET. Run a
# test executable there with libtest's flags, e.g. `.gpu/bin/test-gpu --test-threads=1`, or the
# whole suite with scripts/gpu-check.sh. RINGREDUCE_COMMIT (default: this checkout's commit, with
# +uncommitted for a dirty tree) is compiled in, since the GPU host may get the tree without .git.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
if [[ -n $exclude ]]; then
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
fi
if [[ -z ${RINGREDUCE_COMMIT:-} ]]; then
  RINGREDUCE_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || RINGREDUCE_COMMIT+="+uncommitted"
fi
export RINGREDUCE_COMMIT
# A build to run on GPUs: the CUDA 12 image whole, its machine code too (CI builds its PTX alone).
unset RINGREDUCE_CUDA12_PTX_ONLY
rm -rf .gpu/bin && mkdir -p .gpu/bin
{
  cargo build --release --bins --examples --message-format=json
  cargo test --release --no-run --all-targets --message-format=json
} | python3 -c '
import json, os, shutil, subprocess, sys
strip = shutil.which("strip") and os.environ.get("STAGE_KEEP_DEBUG") != "1"
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    target, kinds = m["target"], m["target"]["kind"]
    if "bench" in kinds:
        name = "bench-" + target["name"]
    elif m["profile"]["test"]:
        name = "test-" + target["name"]
    elif "example" in kinds:
        name = "example-" + target["name"]
    else:
        name = target["name"]
    dst = os.path.join(".gpu/bin", name)
    shutil.copy2(m["executable"], dst)
    if strip:
        subprocess.run(["strip", dst], check=False)
    print("staged", name)
'
du -sh .gpu/bin | awk '{print "staged:", $1, "in .gpu/bin"}'
