#!/usr/bin/env bash
# The gate's selftest on one H200 (#13): produces reports/h200/selftest.md, selftest.json and
# selftest-log.txt (copy them from $OUT/selftest/).
#
#     bash evidence/h200/selftest.sh          # from the repository root; ~6 min on one H200
#
# It runs `attn-gate selftest --kernel sdpa-flash --suite pr --device cuda --out $OUT/selftest`:
# both controls (sdpa-flash and tiled, each swept twice against a baseline made in the run), every
# planted correctness bug through the real check path, then planted forward/backward slowdowns of
# 1-10% and an A/A control, repeated while the time budget lasts (SELFTEST_BUDGET_S, default 330 s
# for the whole run; at least one repetition). selftest.json/.md are rewritten after every step,
# so a timeout still leaves the results so far. The exit code is the selftest's (0 all controls
# pass and every planted bug is killed, 1 not, 2 usage error); the wall time is printed last.
#
# Knobs: OUT (default out/h200_selftest), SELFTEST_BUDGET_S (330), SELFTEST_REPS (5).
# SELFTEST_DRY=1: a CPU rehearsal of the same run (sdpa-cpu on smoke, slowdowns with a busy-wait,
# one repetition): checks the plumbing, measures nothing about GPUs.
set -uo pipefail
OUT=${OUT:-out/h200_selftest}
mkdir -p "$OUT/selftest"
if [ "${SELFTEST_DRY:-}" = 1 ]; then
  args=(--kernel sdpa-cpu --suite smoke --device cpu --rehearse-slowdowns-on-cpu --reps 1)
else
  args=(--kernel sdpa-flash --suite pr --device cuda --budget-s "${SELFTEST_BUDGET_S:-330}" --reps "${SELFTEST_REPS:-5}")
fi
start=$(date +%s)
PYTHONPATH=. python3 -m gate selftest "${args[@]}" --out "$OUT/selftest" 2>&1 | tee "$OUT/selftest/selftest-log.txt"
rc=${PIPESTATUS[0]}
echo "selftest exit $rc, wall $(( $(date +%s) - start )) s" | tee -a "$OUT/selftest/selftest-log.txt"
exit "$rc"
