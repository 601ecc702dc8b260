#!/usr/bin/env bash
# torch_jobs.sh LIB OUT [N ...] — the real PyTorch jobs of torch_jobs.py, each under ringreduce's
# library (LIB: the path of libringreduce_nccl.so, preloaded) and under the real NCCL (torch's
# own, each rank claiming a host of its own), with N processes sharing GPU 0 (default: 2 and 3),
# then compared step by step. Logs and each run's tensors go under OUT. TORCH_JOBS names the
# jobs (default: every job but mesh, which needs 4 processes; late and killed run at the first
# N only). Prints one line per job and side and the comparison; exits 1 if anything failed.
#
# killed: the last rank SIGKILLs itself, so torchrun's exit code is a failure whatever happens;
# the run passes when every other rank printed `rank R: killed ok` (under ringreduce: its second
# all-reduce failed within TORCH_JOBS_KILLED_WAIT seconds, default 30; under the real NCCL it may
# still wait, as expected). torchrun ends the other workers as soon as it sees one die, so this
# job's torchrun looks only every TORCH_JOBS_KILLED_WAIT + 30 seconds: each side of it takes
# that long.
set -u
lib=${1:?LIB} out=${2:?OUT}
shift 2
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2 3)
here=$(cd "$(dirname "$0")" && pwd)
jobs=${TORCH_JOBS:-premul groups ddp fsdp pipeline late coalesce gatherscatter graph killed}
killed_wait=${TORCH_JOBS_KILLED_WAIT:-30}
mkdir -p "$out"

# Every rank of an N-rank `killed` run but the last said `rank R: killed ok` in LOG.
survivors_ok() {
  local n=$1 log=$2 r
  for ((r = 0; r < n - 1; r++)); do
    grep -qF "rank $r: killed ok" "$log" || return 1
  done
}

failed=0
port=29600
for n in "${sizes[@]}"; do
  for job in $jobs; do
    [[ ($job == late || $job == killed) && $n != "${sizes[0]}" ]] && continue
    watch=()
    [[ $job == killed ]] && watch=(--monitor-interval "$((${killed_wait%.*} + 30))")
    for side in nccl ringreduce; do
      port=$((port + 1))
      run=(timeout "${TORCH_JOBS_TIMEOUT:-400}" python3 -m torch.distributed.run --nproc_per_node "$n" --master-port "$port"
        ${watch[@]+"${watch[@]}"} "$here/torch_jobs.py" "$job" "$out/$n/$side")
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
      if [[ $job == killed ]]; then
        survivors_ok "$n" "$log"
        rc=$?
      fi
      printf '%s processes, %-13s on %-10s rc=%s (%s s)\n' "$n" "$job" "$side" "$rc" \
        "$((SECONDS - start))"
      [[ $job == killed ]] && grep -F ": killed:" "$log" | sed 's/^/    /'
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
