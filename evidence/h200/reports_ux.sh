#!/usr/bin/env bash
# Regenerate the H200 example reports in the #15 layout (worst-first PR comment, readable plots).
#
# Produces, under $OUT (default out/h200_reports), to be copied into reports/h200/:
#   check-sdpa-flash-pr/   a passing `attn-gate check --perf` of the configured GPU kernel against
#                          baselines/h200/sdpa-flash-pr.json: comment-*.md (speed baseline -> now ->
#                          change per pass), check-*.md, findings/sweep/perf JSON, ratios-*.png,
#                          speed-*.png
#   check-causal-bug-pr/   the same suite with a planted bug (tests.buggy_kernels:causal_off_by_one, a
#                          causal diagonal off by one) against the same baseline: the failing comment
#   rerender-sdpa-flash-pr/  the committed reports/h200/sweep-sdpa-flash-pr.json re-rendered with
#                          `check --results` (no GPU work; a fallback when the GPU parts time out)
#   log.txt                every command's output; summary.txt, a short table printed at the end
#
# Run on the H200, from the repository root, with the project's .venv active:
#     OUT=out/h200_reports bash evidence/h200/reports_ux.sh
#     cp -r out/h200_reports/check-* reports/h200/
# Each part has its own time budget (PART_BUDGET_S, default 540 s) and writes as it goes; a part
# that times out or errors is reported as such and the next one runs.
# Dry run on a CPU (plumbing only, measures nothing about GPUs): DRY=1 bash evidence/h200/reports_ux.sh
set -u
OUT=${OUT:-out/h200_reports}
BUDGET=${PART_BUDGET_S:-540}
mkdir -p "$OUT"
: > "$OUT/log.txt"
: > "$OUT/summary.txt"
if [ "${DRY:-0}" = 1 ]; then
  DEVICE=(--device cpu); SUITE=smoke; KERNEL=sdpa-cpu; BASE=baselines/cpu/sdpa-cpu-smoke.json; PERF=(--no-perf)
else
  DEVICE=(--device cuda); SUITE=pr; KERNEL=sdpa-flash; BASE=baselines/h200/sdpa-flash-pr.json; PERF=(--perf)
fi

part() {  # part NAME EXPECTED_RC COMMAND...
  local name=$1 expected=$2; shift 2
  local start=$SECONDS
  echo "== $name: $*" | tee -a "$OUT/log.txt"
  timeout "$BUDGET" "$@" >> "$OUT/log.txt" 2>&1
  local rc=$?
  local verdict="ok"
  if [ $rc -eq 124 ]; then verdict="TIMED OUT after ${BUDGET}s"; elif [ $rc -ne "$expected" ]; then verdict="unexpected exit $rc"; fi
  printf '%-24s exit %-3s (expected %s) %4ss  %s\n' "$name" "$rc" "$expected" $((SECONDS - start)) "$verdict" | tee -a "$OUT/summary.txt"
}

part "check-$KERNEL-$SUITE" 0 attn-gate check --kernel "$KERNEL" --suite "$SUITE" "${DEVICE[@]}" "${PERF[@]}" \
  --out "$OUT/check-$KERNEL-$SUITE"
part "check-causal-bug-$SUITE" 1 attn-gate check --kernel tests.buggy_kernels:causal_off_by_one --suite "$SUITE" \
  "${DEVICE[@]}" --no-perf --baseline "$BASE" --out "$OUT/check-causal-bug-$SUITE"
if [ "${DRY:-0}" != 1 ]; then
  part "rerender-sdpa-flash-pr" 0 attn-gate check --results reports/h200/sweep-sdpa-flash-pr.json \
    --baseline "$BASE" --out "$OUT/rerender-sdpa-flash-pr"
fi

echo
echo "summary ($OUT/summary.txt):"
cat "$OUT/summary.txt"
for f in "$OUT"/check-*/comment-*.md; do
  [ -f "$f" ] && { echo; echo "--- $f (first lines)"; head -n 4 "$f"; }
done
