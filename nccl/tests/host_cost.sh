#!/usr/bin/env bash
# host_cost.sh LIB [ROUNDS] — host time of an eager 8-byte ncclAllReduce through ctypes
# (host_cost.py), two processes sharing GPU 0, under ringreduce's library (LIB: the path of
# libringreduce_nccl.so) and under the real NCCL (torch's wheel's libnccl.so.2, each rank
# claiming a host of its own), alternating ROUNDS times (default 3). Prints each rank's JSON line.
set -u
lib=${1:?LIB}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
nccl=$(python3 -c "import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], 'lib', 'libnccl.so.2'))")
failed=0
for round in $(seq "$rounds"); do
  for side in nccl ringreduce; do
    dir=$(mktemp -d)
    pids=()
    for rank in 0 1; do
      if [[ $side == nccl ]]; then
        NCCL_HOSTID=host$rank NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 \
          timeout 300 python3 "$here/host_cost.py" "$nccl" $rank 2 "$dir" &
      else
        RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1 \
          timeout 300 python3 "$here/host_cost.py" "$lib" $rank 2 "$dir" &
      fi
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "round $round $side: a rank failed"; failed=1; }; done
    rm -rf "$dir"
  done
done
exit $failed
