#!/usr/bin/env bash
# The nightly tier of several kernels on one H200, across as many device calls as it takes (issue #9):
# each call goes on where the last one stopped. A kernel's sweep journals every case into the git-ignored
# out/h200-nightly/<kernel>/ (kept between calls while the machine is warm; carry that folder to go on
# after a cold start), so a call cut by its budget resumes with `--resume` in the next one. When a
# kernel's sweep is complete its speed cases run once (`attn-gate perf --suite nightly`).
#
#   KERNELS=sdpa-efficient,sdpa-cudnn NIGHTLY_BUDGET_S=540 bash evidence/h200/nightly.sh
#
# Wall time per kernel = the sum of its calls' sweep seconds (status.txt) plus its perf seconds. On a host
# with several GPUs the kernels run side by side, one lane per GPU (NIGHTLY_LANES to choose).
# $OUT/nightly.tar.gz packs out/h200-nightly/ (sweep JSON, validation note, perf JSON and table, the
# journals, logs: one file, as the device returns at most 8); $OUT/status.txt has one line per step:
# rc, wall seconds, the verdict line. NIGHTLY_DEVICE=cpu NIGHTLY_SUITE=smoke KERNELS=tiled rehearses it
# on a CPU (plumbing only).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUTDIR=${OUT:-out/h200_nightly}; mkdir -p "$OUTDIR"
deadline=$(( $(date +%s) + ${NIGHTLY_BUDGET_S:-540} ))
suite=${NIGHTLY_SUITE:-nightly} device=${NIGHTLY_DEVICE:-cuda} state=${NIGHTLY_STATE:-out/h200-nightly}
status() { echo "$*" | tee -a "$OUTDIR/status.txt"; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUTDIR/pip.log" 2>&1 || status "pip install -e . failed"
IFS=, read -r -a kernels <<< "${KERNELS:?KERNELS=k1,k2,...}"
one_kernel() {  # k: its sweep (fresh or resumed) within the budget, then its speed cases once the sweep is whole
  local k=$1 d=$state/$1 left resume t0 log rc; mkdir -p "$d"
  if [ ! -f "$d/sweep-$k-$suite.json" ]; then
    left=$(( deadline - $(date +%s) )); [ "$left" -lt 30 ] && { status "$k sweep not started: budget spent"; return; }
    resume=; [ -f "$d/journal-$k-$suite.jsonl" ] && resume=--resume
    t0=$(date +%s); log="$d/sweep-$t0.log"
    timeout "$left" python3 -m gate sweep --kernel "$k" --suite "$suite" --device "$device" --no-progress --out "$d" $resume \
      > "$log" 2>&1
    rc=$?
    if [ "$rc" = 2 ] && [ -n "$resume" ] && grep -q -- "--resume:" "$log"; then
      # the journal is another run's (another host after a cold start, other code): kept aside, not resumed
      mv "$d/journal-$k-$suite.jsonl" "$d/journal-$k-$suite.refused-$(date +%s).jsonl"
      status "$k sweep: --resume refused ($(grep -h -- '--resume:' "$log" | tail -1 | cut -c1-160)); journal set aside, next call starts afresh"
    fi
    status "$k sweep ${resume:-(fresh)} rc=$rc wall_s=$(( $(date +%s) - t0 )) $(grep -hE '^(PASS|FAIL)' "$log" | tail -1)"
  fi
  if [ -f "$d/sweep-$k-$suite.json" ] && [ ! -f "$d/perf-$k-$suite.json" ]; then
    left=$(( deadline - $(date +%s) )); [ "$left" -lt 60 ] && { status "$k perf not started: budget spent"; return; }
    t0=$(date +%s)
    timeout "$left" python3 -m gate perf --kernel "$k" --suite "$suite" --device "$device" --out "$d" > "$d/perf-table.txt" 2>&1
    status "$k perf rc=$? wall_s=$(( $(date +%s) - t0 ))"
  fi
}
# lanes: one per GPU (NIGHTLY_LANES overrides), kernels dealt round-robin; a lane sees only its GPU and,
# with taskset, its share of the cores, so one lane's compiles and references do not slow another's timing
lanes=${NIGHTLY_LANES:-$( [ "$device" = cuda ] && nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)}
[ "$lanes" -ge 1 ] 2>/dev/null || lanes=1
cores=$(nproc); per=$(( cores / lanes > 0 ? cores / lanes : 1 ))
lane() {  # i: the kernels i, i + lanes, ... one after another on GPU i
  local i=$1 j gpu=${CUDA_VISIBLE_DEVICES-0}
  [ "$lanes" -gt 1 ] && gpu=$i
  for (( j = i; j < ${#kernels[@]}; j += lanes )); do
    if [ "$lanes" -gt 1 ] && command -v taskset > /dev/null; then
      CUDA_VISIBLE_DEVICES=$gpu taskset -c $(( i * per ))-$(( i * per + per - 1 )) \
        bash -c "$(declare -f status one_kernel); one_kernel ${kernels[j]}"
    else
      CUDA_VISIBLE_DEVICES=$gpu one_kernel "${kernels[j]}"
    fi
  done
}
export OUTDIR deadline suite device state
for (( i = 0; i < lanes; i++ )); do lane "$i" & done
wait
tar -czf "$OUTDIR/nightly.tar.gz" -C "$(dirname "$state")" "$(basename "$state")"
echo; cat "$OUTDIR/status.txt"
