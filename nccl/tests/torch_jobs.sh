#!/usr/bin/env bash
# torch_jobs.sh LIB OUT [N ...] — the real PyTorch jobs of torch_jobs.py, each under ringreduce's
# library (LIB: the path of libringreduce_nccl.so, preloaded) and under the real NCCL (torch's
# own, each rank claiming a host of its own), with N processes sharing GPU 0 (default: 2 and 3),
# then compared step by step. Logs and each run's tensors go under OUT. TORCH_JOBS names the
# jobs (default: every job but mesh, which needs 4 processes; late runs at the first N only).
# Prints one line per job and side and the comparison; exits 1 if anything failed.
set -u
lib=${1:?LIB} out=${2:?OUT}
shift 2
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2 3)
here=$(cd "$(dirname "$0")" && pwd)
jobs=${TORCH_JOBS:-premul groups ddp fsdp pipeline late}
mkdir -p "$out"
failed=0
port=29600
for n in "${sizes[@]}"; do
  for job in $jobs; do
    [[ $job == late && $n != "${sizes[0]}" ]] && continue
    for side in nccl ringreduce; do
      port=$((port + 1))
      run=(timeout "${TORCH_JOBS_TIMEOUT:-400}" python3 -m torch.distributed.run --nproc_per_node "$n" --master-port "$port"
        "$here/torch_jobs.py" "$job" "$out/$n/$side")
      log=$out/$n-$job-$side.log
      start=$SECONDS
      if [[ $side == nccl ]]; then
        TORCH_JOBS_REAL_NCCL=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 \
          "${run[@]}" > "$log" 2>&1
      else
        LD_PRELOAD=$lib RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1 RINGREDUCE_NCCL_LOG=1 \
          "${run[@]}" > "$log" 2>&1
      fi
      rc=$?
      printf '%s processes, %-8s on %-10s rc=%s (%s s)\n' "$n" "$job" "$side" "$rc" \
        "$((SECONDS - start))"
      if [[ $rc != 0 ]]; then
        failed=1
        grep -E "FAILED|Error|error" "$log" | head -5
      fi
    done
  done
  echo "== $n processes: ringreduce against the real NCCL"
  python3 "$here/torch_jobs.py" compare "$out/$n/nccl" "$out/$n/ringreduce" > "$out/$n-compare.log" 2>&1 \
    || failed=1
  grep -vE " same " "$out/$n-compare.log"
done
exit $failed
