#!/usr/bin/env bash
# One H200 session of evidence for issues #9-#16, in three device calls of < 10 minutes each, run
# back to back (the machine stays warm between them). Each call packs everything it wrote into
# $OUT/partN.tar.gz (the device returns at most 8 files) and prints a short table.
#
#   CALL=1 bash evidence/h200/session.sh   # timing, alone on the GPU: baseline update of sdpa-flash on pr
#                                          # (sweep + speed) and the wall-timed pr verdict (coverage.sh
#                                          # PART=flash, issue #9's <= 180 s)
#   CALL=2 bash evidence/h200/session.sh   # correctness, in parallel: the pr sweeps (coverage.sh
#                                          # PART=sweeps, #9), bias sweeps (#16), decode/paged/sinks sweeps
#                                          # (entry.py part A, #10; fa2 via the Triton wheel if carried in
#                                          # .whl); then the selftest of sdpa-flash on pr (#13), alone on
#                                          # the GPU
#   CALL=3 bash evidence/h200/session.sh   # isolation.py (#11: a CUDA illegal memory access in one case,
#                                          # worker overhead; ISO_ROOT names the tree holding it), the
#                                          # decode/varlen speed cases (entry.py part B, #10) and the asv
#                                          # step a PR run adds (pr_asv.py, #12)
#
# Produces, once unpacked and copied: reports/h200/coverage/, bias/, entry/, selftest/, isolation/,
# entry-perf/, pr-asv/ and baselines/h200/sdpa-flash-pr.json (from part1's coverage/flash/baselines).
# Budgets are environment knobs of the scripts it calls; the defaults here keep each call < 9.5 min.
set -uo pipefail
call=${CALL:?CALL=1, 2 or 3}
RESULT=${OUT:-out/h200_session}  # what comes back: partN.tar.gz and session-N.txt
OUT=${WORK:-/tmp/h200_session}/part$call  # everything the scripts write, packed at the end
mkdir -p "$OUT" "$RESULT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then  # carried wheels (asv and its needs; the fa2 Triton wheel), into
  # the interpreter's own site-packages: asv drops PYTHONPATH for its benchmark processes
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl > "$OUT/pip-wheels.log" 2>&1 \
    || echo "carried wheels did not install (see pip-wheels.log)"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1 || echo "pip install -e . failed (see pip.log)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > "$OUT/nvidia-smi.txt" 2>&1
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/session.txt"; }

case "$call" in
1)
  say "coverage PART=flash"
  OUT="$OUT" PART=flash BASELINE_BUDGET_S=${BASELINE_BUDGET_S:-330} CHECK_BUDGET_S=${CHECK_BUDGET_S:-200} \
    bash evidence/h200/coverage.sh > "$OUT/coverage-flash.log" 2>&1
  say "coverage PART=flash rc=$?"
  ;;
2)
  say "correctness sweeps in parallel"
  ( OUT="$OUT" PART=sweeps SWEEP_BUDGET_S=${SWEEP_BUDGET_S:-170} bash evidence/h200/coverage.sh > "$OUT/coverage-sweeps.log" 2>&1
    say "coverage sweeps rc=$?" ) &
  ( OUT="$OUT/bias" BIAS_BUDGET_S=${BIAS_BUDGET_S:-170} timeout 230 python3 evidence/h200/bias_sweeps.py > "$OUT/bias.log" 2>&1
    say "bias sweeps rc=$?" ) &
  ( OUT="$OUT/entry" ENTRY_PART=A ENTRY_BUDGET_S=${ENTRY_BUDGET_S:-170} timeout 230 python3 evidence/h200/entry.py > "$OUT/entry.log" 2>&1
    say "entry part A rc=$?" ) &
  wait
  say "selftest sdpa-flash pr"
  OUT="$OUT" SELFTEST_BUDGET_S=${SELFTEST_BUDGET_S:-240} SELFTEST_REPS=${SELFTEST_REPS:-3} timeout 300 \
    bash evidence/h200/selftest.sh > "$OUT/selftest.log" 2>&1
  say "selftest rc=$?"
  ;;
3)
  # ISO_ROOT: the tree that holds the worker-isolation code (#11), the repository itself once merged
  iso=${ISO_ROOT:-.}
  say "isolation (CUDA fault, worker overhead) from $iso"
  OUT="$OUT/isolation" H200_ISO_BUDGET_S=${H200_ISO_BUDGET_S:-225} PYTHONPATH=$iso timeout 260 \
    python3 "$iso/evidence/h200/isolation.py" > "$OUT/isolation.log" 2>&1
  say "isolation rc=$?"
  say "entry part B (decode and varlen speed)"
  OUT="$OUT/entry-perf" ENTRY_PART=B ENTRY_PERF_S=${ENTRY_PERF_S:-70} timeout 120 python3 evidence/h200/entry.py \
    > "$OUT/entry-perf.log" 2>&1
  say "entry part B rc=$?"
  say "pr asv"
  OUT="$OUT/pr-asv" H200_PR_ASV_BUDGET_S=${H200_PR_ASV_BUDGET_S:-150} timeout 300 python3 evidence/h200/pr_asv.py \
    > "$OUT/pr-asv.log" 2>&1
  say "pr asv rc=$?"
  ;;
esac
say "done"
tar -czf "$RESULT/part$call.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
cp "$OUT/session.txt" "$RESULT/session-$call.txt"
cat "$OUT/session.txt"
