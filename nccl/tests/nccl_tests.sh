#!/usr/bin/env bash
# nccl_tests.sh BUILD LIB OUT [NP ...] — NVIDIA's nccl-tests (github.com/NVIDIA/nccl-tests, built
# with MPI=1 against the real NCCL's header; BUILD holds its *_perf executables — never
# committed here) under mpirun with NP processes (default: 2 and 3), every process on GPU 0
# (NCCL_TESTS_DEVICE=0), each executable with -c 1 (every result checked): once with this
# library preloaded (LIB: libringreduce_nccl.so), once on the real NCCL (each rank claiming a
# host of its own, NCCL_HOSTID, so that NCCL accepts ranks sharing a GPU). Logs go under OUT;
# prints one line per run with its exit code and nccl-tests' count of wrong values; exits 1 if
# any run failed or found one. BUILD may instead be nccl-tests' source tree (its Makefile, no
# build/ yet): it is built first, into BUILD/build, with MPI=1 against the header and library of
# torch's NCCL wheel, the machine's CUDA (CUDA_HOME, default /usr/local/cuda) and Open MPI, for
# GPU 0's architecture.
set -u
build=${1:?BUILD} lib=${2:?LIB} out=${3:?OUT}
shift 3
# The real NCCL: torch's wheel's, where python3 finds one (its executables need libnccl.so.2).
wheel=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2> /dev/null)
[[ -n $wheel ]] && export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ -f $build/Makefile && ! -x $build/build/all_reduce_perf ]]; then
  [[ -n $wheel ]] || { echo "no NCCL wheel to build nccl-tests against (python3 -c 'import nvidia.nccl')"; exit 1; }
  home=$(mktemp -d)
  mkdir -p "$home/lib"
  ln -s "$wheel/include" "$home/include"
  ln -s "$wheel/lib/libnccl.so.2" "$home/lib/libnccl.so"
  mpi=$(dirname "$(mpicc --showme:incdirs | tr ' ' '\n' | head -1)")
  sm=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  make -C "$build" -j"$(nproc)" MPI=1 MPI_HOME="$mpi" NCCL_HOME="$home" \
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" NVCC_GENCODE="-gencode=arch=compute_$sm,code=sm_$sm" \
    > "$build/make.log" 2>&1 || { echo "nccl-tests did not build: $build/make.log"; exit 1; }
fi
[[ -x $build/build/all_reduce_perf ]] && build=$build/build
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2 3)
mkdir -p "$out"
failed=0
for np in "${sizes[@]}"; do
  for exe in "$build"/*_perf; do
    name=$(basename "$exe")
    for side in ringreduce nccl; do
      log=$out/$np-$name-$side.log
      if [[ $side == ringreduce ]]; then
        env=(-x LD_PRELOAD="$lib" -x RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1)
        wrap=()
      else
        env=(-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1)
        wrap=(bash -c 'NCCL_HOSTID=nccl-tests-host-$OMPI_COMM_WORLD_RANK exec "$@"' --)
      fi
      timeout "${NCCL_TESTS_TIMEOUT:-120}" mpirun --allow-run-as-root --oversubscribe -np "$np" \
        -x NCCL_TESTS_DEVICE=0 -x NCCL_NVLS_ENABLE=0 "${env[@]}" \
        "${wrap[@]}" "$exe" -b 8 -e "${NCCL_TESTS_MAX:-1M}" -f 8 -c 1 -g 1 > "$log" 2>&1
      rc=$?
      wrong=$(grep -oE 'Out of bounds values : [0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
      printf '%s processes %-22s %-10s rc=%s wrong=%s\n' "$np" "$name" "$side" "$rc" "$wrong"
      [[ $rc == 0 && $wrong == 0 ]] || failed=1
    done
  done
done
exit $failed
