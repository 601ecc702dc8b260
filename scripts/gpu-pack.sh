#!/usr/bin/env bash
# gpu-pack.sh — build what a GPU run needs, small enough to carry (the device tool carries at most
# 64 MiB; scripts/stage.sh stages everything, ~140 MiB).
#
#   scripts/gpu-pack.sh DIR [TEST ...]     # default tests: every GPU suite
#   EXAMPLES='13_gpu_processes' scripts/gpu-pack.sh DIR TEST   # also those examples
#   WHEEL=1 scripts/gpu-pack.sh DIR nccl:gpu_ranks   # also the Python wheel (DIR/bin/wheels; needs
#     maturin: pip install maturin) — with nccl:* for gpu-suite.sh's torch phase
#   CUDA12=1 scripts/gpu-pack.sh DIR gpu_cuda12   # with the CUDA 12 image (kept out otherwise)
#   scripts/gpu-pack.sh DIR examples   # tests/examples.rs with the guide's examples (DIR/examples)
#   scripts/gpu-pack.sh DIR cli:baseline_one_gpu   # the CLI crate's tests (cli/tests/NAME.rs)
#   scripts/gpu-pack.sh DIR nccl:gpu_ranks nccl:c_api   # ringreduce-nccl's tests (set
#     RINGREDUCE_NCCL_SOURCES=nccl there for the C test's header and program)
#
# Builds the CLI and the named integration tests (tests/TEST.rs; `lib`: the library's unit tests) with nvcc (the kernels as an
# embedded fatbin; RINGREDUCE_REQUIRE_NVCC=1 makes a build without nvcc fail rather than fall back
# to NVRTC), copies them as DIR/bin/ringreduce and DIR/bin/test-TEST with scripts/gpu-suite.sh
# and the scripts/gpu-counts.sh it sources, strips them and packs DIR/run.tar.xz (then removes
# DIR/bin). The report's commit line is set from git. On the GPU host: `cd DIR && tar xJf run.tar.xz && bash bin/gpu-suite.sh tests $OUT`.
set -euo pipefail
out=${1:?DIR}
shift
tests=("$@")
if [[ ${#tests[@]} -eq 0 ]]; then
  tests=(lib gpu gpu_graphs gpu_streams gpu_user gpu_collectives gpu_ll_one_device)
fi
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ -n "${NVCC:-}" && -n "${NVRTC_CUDA12:-}" ]] || eval "$(bash .ci/install-nvcc.sh --export)"
# The CUDA 12 image (~10 MB in every binary, which would not fit the carry limit) only with
# CUDA12=1 — for tests/gpu_cuda12.rs; the GPU host's CUDA 13 driver loads the fatbin.
if [[ "${CUDA12:-0}" == 1 ]]; then
  export NVRTC_CUDA12 RINGREDUCE_REQUIRE_CUDA12=1
  # Its machine code too (CI builds the PTX alone: build.rs).
  unset RINGREDUCE_CUDA12_PTX_ONLY
else
  unset NVRTC_CUDA12
  export RINGREDUCE_REQUIRE_CUDA12=0
fi
export NVCC RINGREDUCE_REQUIRE_NVCC=1 RINGREDUCE_COMMIT
RINGREDUCE_COMMIT=$(git rev-parse --short=12 HEAD)
cargo build --release -q -p ringreduce-cli
rm -rf "$out/bin" && mkdir -p "$out/bin"
cp target/release/ringreduce scripts/gpu-suite.sh scripts/gpu-counts.sh "$out/bin/"
# Examples named in EXAMPLES (space-separated), as DIR/bin/NAME.
for e in ${EXAMPLES:-}; do
  cargo build --release -q --example "$e"
  cp "target/release/examples/$e" "$out/bin/"
done
# The Python package as one abi3 wheel, for the torch phase of gpu-suite.sh.
if [[ -n ${WHEEL:-} ]]; then
  wheels=$(cd "$out/bin" && pwd)/wheels
  (cd python && maturin build --release --strip -q -o "$wheels")
fi
for t in "${tests[@]}"; do
  # The executable cargo just built for this test: the path it prints as JSON.
  # `lib` is the library's own unit tests (the device layer's among them).
  # -p: the core's test, not a same-named test of another workspace member (ringreduce-nccl
  # has a gpu_ranks too).
  target=(-p ringreduce --test "$t")
  [[ $t == lib ]] && target=(-p ringreduce --lib)
  # nccl:NAME is ringreduce-nccl's test NAME (packed as test-nccl-NAME, with the library beside).
  if [[ $t == nccl:* ]]; then
    target=(-p ringreduce-nccl --test "${t#nccl:}")
    cargo build --release -q -p ringreduce-nccl
    cp target/release/libringreduce_nccl.so "$out/bin/"
  fi
  # cli:NAME is the CLI crate's test NAME (packed as test-cli-NAME).
  [[ $t == cli:* ]] && target=(-p ringreduce-cli --test "${t#cli:}")
  exe=$(cargo test --release -q --no-run "${target[@]}" --message-format=json \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -1)
  cp "$exe" "$out/bin/test-${t/:/-}"
done
# tests/examples.rs runs the examples from ../examples beside its executable's folder (as in
# target/<profile>/): with the `examples` test, every guide example it runs goes to DIR/examples.
parts=(bin)
if [[ " ${tests[*]} " == *" examples "* ]]; then
  cargo build --release -q --examples
  rm -rf "$out/examples" && mkdir -p "$out/examples"
  for e in examples/[01][0-9]_*.rs; do
    cp "target/release/examples/$(basename "$e" .rs)" "$out/examples/"
  done
  strip "$out"/examples/* 2>/dev/null || true
  parts+=(examples)
fi
strip "$out"/bin/ringreduce "$out"/bin/test-* "$out"/bin/*.so 2>/dev/null || true
rm -f "$out/run.tar.xz"
tar cJf "$out/run.tar.xz" -C "$out" "${parts[@]}"
rm -rf "$out/bin" "$out/examples"
ls -la "$out/run.tar.xz"
# The device tool carries the tracked tree beside the pack, 64 MiB in all.
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
pack=$(stat -c %s "$out/run.tar.xz")
if ((tree + pack > 64 * 1024 * 1024)); then
  echo "gpu-pack: the pack ($pack B) and the tracked tree ($tree B) exceed the 64 MiB a device call carries: pack fewer tests" >&2
  exit 1
fi
