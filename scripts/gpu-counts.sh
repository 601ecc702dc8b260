# gpu-counts.sh — sourced by gpu-suite.sh and gpu-check.sh (bash): how many GPUs a run is meant
# to have, and what a test binary's log says it did.
#
#   require_gpus        exports RINGREDUCE_REQUIRE_GPUS (the rule: tests/common/waiver.rs) as the
#                       number of GPUs CUDA will see here, unless the caller set it, and sets
#                       require_note to a line that says where the number came from
#   test_counts LOG     prints `passed=P failed=F waived=W shared=S` for a libtest log written
#                       with `--nocapture --test-threads=1`, each test counted once: waived, a test
#                       libtest passed whose output has a `waived:` line (no GPU for it); shared,
#                       one whose output has the `note: one GPU: the ranks share GPU 0` line
#                       (tests/common/mod.rs's SHARED_NOTE: ranks standing in for two GPUs on
#                       one: correctness, not a two-GPU pass);
#                       passed, the others libtest passed

require_gpus() {
  if [[ -n "${RINGREDUCE_REQUIRE_GPUS:-}" ]]; then
    export RINGREDUCE_REQUIRE_GPUS
    require_note="RINGREDUCE_REQUIRE_GPUS=$RINGREDUCE_REQUIRE_GPUS (set by the caller)"
    return
  fi
  local listed visible from
  listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  listed=${listed:-0}
  from="nvidia-smi -L"
  visible=$listed
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    # CUDA sees the listed entries only (an empty list: none), at most what the machine has.
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c '[^[:space:]]' || true)
    ((visible > listed)) && visible=$listed
    from="$from and CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
  fi
  export RINGREDUCE_REQUIRE_GPUS=$visible
  if ((visible == 0)); then
    require_note="RINGREDUCE_REQUIRE_GPUS=0 ($from: no GPU, so tests waive missing GPUs, none fails for them)"
  else
    require_note="RINGREDUCE_REQUIRE_GPUS=$visible ($from): a test that needs at most $visible GPU(s) fails where it finds fewer"
  fi
}

test_counts() {
  awk '
    # A test opens with `test NAME ... `; its output follows (with --nocapture), then its result
    # alone on a line, or right after the opening when it printed nothing.
    /^test [^ ]+ \.\.\. / {
      open = 1; waived = 0; shared = 0
      line = substr($0, index($0, " ... ") + 5)
    }
    !/^test [^ ]+ \.\.\. / { line = $0 }
    open && index(line, "waived:") { waived = 1 }
    open && index(line, "note: one GPU: the ranks share GPU 0") { shared = 1 }
    open && line == "ok" {
      if (waived) waivers++; else if (shared) stand_ins++; else passed++
      open = 0
    }
    open && line == "FAILED" { failed++; open = 0 }
    open && line ~ /^ignored/ { ignored++; open = 0 }
    /^test result: / { summary = 1; said_passed = $4; said_failed = $6 }
    END {
      printf "passed=%d failed=%d waived=%d shared=%d", passed, failed, waivers, stand_ins
      if (ignored) printf " ignored=%d", ignored
      if (!summary) printf " (incomplete: no libtest summary; the binary was stopped or crashed)"
      else if (said_passed + 0 != passed + waivers + stand_ins || said_failed + 0 != failed)
        printf " (libtest says %d passed, %d failed)", said_passed, said_failed
      printf "\n"
    }
  ' "$1"
}
