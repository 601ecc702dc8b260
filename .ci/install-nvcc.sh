#!/usr/bin/env bash
# Installs nvcc 13.0 and NVRTC 12.9 from NVIDIA's PyPI wheels into a private folder and prints
# nvcc's path.
#
#   NVCC="$(bash .ci/install-nvcc.sh)"        # the path, alone on stdout
#   eval "$(bash .ci/install-nvcc.sh --export)"  # or: export NVCC=<path> NVRTC_CUDA12=<path>
#
# No GPU and no CUDA toolkit are needed: build.rs runs this nvcc to compile the kernels (cuda/*.cuh,
# joined) into a fatbin. The wheels unpack into one tree, <prefix>/nvidia/cu13/{bin,include,lib,
# nvvm}, and bin/nvcc.profile finds headers and cicc relative to bin/, so nothing else needs setting (build.rs
# resolves symlinks to nvcc before running it). A host C++ compiler (g++) must be on PATH: nvcc
# runs its preprocessor even for device-only output.
#
# Idempotent: a stamp file records the pinned wheel set; when it matches and nvcc runs, nothing is
# downloaded. A changed pin list reinstalls. The install goes to a temporary folder first and is
# moved into place at the end, so an interrupted run never leaves a half install that looks done.
#
# Environment: NVCC_PREFIX (default ~/.cache/ringreduce-nvcc), PYTHON (default python3).
# Versions: CUDA 13.0 Update 2, matching the GPU host's toolkit (nvcc 13.0.88, driver 580). Keep
# the major.minor at or below the driver's CUDA version: the fatbin's PTX must JIT there.
set -euo pipefail

WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-nvrtc-cu12==12.9.86
)

prefix="${NVCC_PREFIX:-$HOME/.cache/ringreduce-nvcc}"
python="${PYTHON:-python3}"
nvcc="$prefix/nvidia/cu13/bin/nvcc"
nvrtc12="$prefix/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
stamp="$prefix/.installed"
want="${WHEELS[*]}"

say() { echo "install-nvcc: $*" >&2; }

print_result() {
    if [[ "${1:-}" == "--export" ]]; then
        printf "export NVCC='%s' NVRTC_CUDA12='%s'\n" "$nvcc" "$nvrtc12"
    else
        printf '%s\n' "$nvcc"
    fi
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f "$nvrtc12" ]] \
    && "$nvcc" --version >/dev/null 2>&1; then
    say "nvcc already installed at $nvcc"
    print_result "${1:-}"
    exit 0
fi

# The prefix is replaced whole: refuse to replace a folder this script did not make.
if [[ -e "$prefix" && ! -f "$stamp" && -n "$(ls -A "$prefix" 2>/dev/null)" ]]; then
    say "$prefix exists and was not made by this script; set NVCC_PREFIX to another folder"
    exit 1
fi

say "installing ${WHEELS[*]} into $prefix"
parent="$(dirname "$prefix")"
mkdir -p "$parent"
staging="$(mktemp -d "$parent/.ringreduce-nvcc.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
chmod 755 "$staging"

PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check \
    --no-deps --no-compile --target "$staging" "${WHEELS[@]}" >&2
printf '%s\n' "$want" >"$staging/.installed"

staged_nvcc="$staging/nvidia/cu13/bin/nvcc"
if ! "$staged_nvcc" --version >&2; then
    say "the installed nvcc does not run: $staged_nvcc"
    exit 1
fi
if [[ ! -f "$staging/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]]; then
    say "the NVRTC 12 wheel did not install libnvrtc.so.12"
    exit 1
fi

rm -rf "$prefix"
mv "$staging" "$prefix"
trap - EXIT
say "installed: $("$nvcc" --version | grep -o 'release .*')"
print_result "${1:-}"
