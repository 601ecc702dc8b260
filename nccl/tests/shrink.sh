#!/usr/bin/env bash
# shrink.sh LIB OUT [NP ...] — compiles tests/c/shrink.c with mpicc against include/nccl.h and
# the GPU host's CUDA runtime, then runs it under mpirun with NP processes on GPU 0 (default 3):
# with this library preloaded (LIB: libringreduce_nccl.so) and on the real NCCL (found on
# LD_LIBRARY_PATH; each rank its own NCCL_HOSTID), once as it is and once with the excluded rank
# standing for a hung one (`shrink abort`: NCCL_SHRINK_ABORT). Exits 1 if a run failed.
set -u
lib=${1:?LIB} out=${2:?OUT}
shift 2
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(3)
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
mpicc -O2 -o "$out/shrink" "$here/c/shrink.c" -I"$here/../include" -I"$cuda/include" \
  -L"$cuda/lib64" -Wl,-rpath,"$cuda/lib64" -lcudart -ldl "$lib" || exit 1
failed=0
for np in "${sizes[@]}"; do
  for mode in plain abort; do
  for side in ringreduce nccl; do
    if [[ $side == ringreduce ]]; then
      env=(-x LD_PRELOAD="$lib" -x RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1 -x RINGREDUCE_NCCL_LOG=1)
      wrap=()
    else
      env=(-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x LD_LIBRARY_PATH)
      wrap=(bash -c 'NCCL_HOSTID=shrink-host-$OMPI_COMM_WORLD_RANK exec "$@"' --)
    fi
    log=$out/$np-shrink-$mode-$side.log
    timeout 60 mpirun --allow-run-as-root --oversubscribe -np "$np" -x NCCL_NVLS_ENABLE=0 \
      "${env[@]}" "${wrap[@]}" "$out/shrink" "$mode" > "$log" 2>&1
    rc=$?
    echo "$np processes, shrink ($mode) on $side: rc=$rc"
    [[ $rc == 0 ]] || { failed=1; tail -5 "$log"; }
  done
  done
done
exit $failed
