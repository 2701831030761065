#!/usr/bin/env bash
# One session of H200 evidence on a host with two H200s (device kind nvidia-h200-x2), in three
# device calls of < 10 minutes each, run back to back while the machine stays warm. Two lanes run
# side by side, one per GPU, each pinned to half of the host's cores (taskset) so a compile or a
# reference on one lane does not steal the CPU that launches the other lane's timed kernels.
#
#   CALL=1  lane 0 (timing, GPU 0 alone): `attn-gate check` of sdpa-flash on pr, wall-timed, against the
#           committed baseline; `baseline update --from-results/--perf-from` of that run (the refresh of
#           baselines/h200/sdpa-flash-pr.json); the check again against the refreshed baseline, wall-timed
#           (issue #9's <= 180 s, isolation on: #11).
#           lane 1 (GPU 1): cudnn_bias_repro.py and the bias sweeps of sdpa-efficient, sdpa-cudnn, flex with
#           the new declarations (#16); nightly shard 1/8 of sdpa-flash with one worker (the 1-GPU half of #11's
#           scale-out measurement).
#           then both GPUs: the same nightly shard with --workers 2 (the 2-GPU half).
#   CALL=2  (carries .wheels/x1, staged to /root/stage for CALL=3)
#           lane 0: `attn-gate selftest` of sdpa-flash on pr, correctness part (--no-slowdowns): controls and
#           every planted bug (#13).
#           lane 1: the same selftest's slowdown part (--bugs of one cheap bug, then planted 1-10 % slowdowns
#           and the A/A control, repeated within the budget) (#13).
#   CALL=3  (carries .wheels/x2: FA4 installed from the staged halves)
#           lane 0: fa4 pr sweep in pieces, fa4-raw-window, the fa4 bias probe (#16) and fa4 decode/sinks (#10).
#           lane 1: flex decode slices (#10), then the pr sweep pieces of flex, sdpa-efficient and sdpa-cudnn
#           that the last session did not reach (#9).
#   CALL=4  (carries .fa3, the FA3 build of reports/fa3-build) lane 0: the selftest's planted slowdowns (#13);
#           lane 1: FA=fa3 evidence/h200/flash_build.sh (#10). CALL_BUDGET_S=570 fits both. FA2 (.fa2, 44 MiB)
#           needs a call of its own: FA=fa2 bash evidence/h200/flash_build.sh.
#   CALL=5  (one GPU) the whole selftest of sdpa-flash on pr: controls, planted bugs, slowdowns (#13).
#   CALL=6  (one GPU, carries .fa3) FA3's flash_build.sh;  CALL=7 (one GPU, carries .fa2) FA2's (#10).
#   CALL=8  (one GPU, carries .fa2) fa2_repro.py and FA2's bf16 causal pr piece again.
#   CALL=9  (one GPU, carries .fa3) FA3's bf16 causal pr piece again; the whole nightly of sdpa-flash, timed (#9).
#   CALL=10 (carries .fa3) / CALL=11 (carries .fa2): the depth checks of FA3 / FA2 (next session).
#   CALL=12 (one GPU) the pr baseline refreshed with anchor_fallback on, alone on the GPU; then FANOUT_QUIET_JOBS.
#   CALL=13/14 FANOUT_JOBS side by side (evidence/h200/fanout.py), 14 resuming 13; FA4 installed (and
#           fa4_gqa_headdim_repro.py run) by the call that finds both halves .wheels/x1, x2 staged (#9).
#   CALL=15 REPROS (scripts run one after another, alone; 2026-12-01d ran cudnn_dout_repro.py beside the sweeps), then
#           FANOUT_QUIET_JOBS (QUIET_MAX_PROCS shards at a time, 1 unless set), alone on the GPU (e.g. the ERROR rows
#           listed in evidence/h200/recheck/), then the FANOUT_JOBS sweeps side by side (if set: else the probes alone).
#   Any call carrying .wheels/x1 or .wheels/x2 (halves of FA4's wheels: evidence/h200/fa4_wheels.sh pack) stages it
#   in /root/stage.
#
# Each call packs what it wrote into $OUT/partN.tar.gz (the device returns at most 8 files) and prints
# status lines; the whole call runs under CALL_BUDGET_S (550 s) so it is packed even when cut. With one GPU visible, lane 1 runs after lane 0 (and takes longer than a call).
set -uo pipefail
call=${CALL:?CALL=1..15}
RESULT=${OUT:-out/h200_x2}
W=${WORK:-/tmp/h200_x2}/part$call
mkdir -p "$W" "$RESULT"
if [ -z "${SESSION_INNER:-}" ]; then  # the work runs under one deadline, so what it wrote is always packed and returned
  SESSION_INNER=1 timeout -k 10 "${CALL_BUDGET_S:-550}" bash "$0"; rc=$?
  [ "$rc" = 124 ] && echo "call $call stopped at its ${CALL_BUDGET_S:-550} s budget" | tee -a "$W/session.txt"
  tar -czf "$RESULT/part$call.tar.gz" -C "$(dirname "$W")" "$(basename "$W")"
  cp "$W/session.txt" "$RESULT/session-$call.txt" 2>/dev/null
  cat "$W/session.txt"
  exit "$rc"
fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-8}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$W/pip.log" 2>&1 || echo "pip install -e . failed (see pip.log)"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv > "$W/nvidia-smi.txt" 2>&1
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
cores=$(nproc); half=$(( cores / 2 ))
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$W/session.txt"; }
pin=; command -v taskset > /dev/null && pin=1
lane() {  # lane N: GPU N and half of the cores (with one GPU: GPU 0, all cores; no taskset: no pinning)
  if [ "$gpus" -ge 2 ] && [ -z "$pin" ]; then echo "env CUDA_VISIBLE_DEVICES=$1"
  elif [ "$gpus" -ge 2 ]; then
    if [ "$1" = 0 ]; then echo "env CUDA_VISIBLE_DEVICES=0 taskset -c 0-$(( half - 1 ))"
    else echo "env CUDA_VISIBLE_DEVICES=1 taskset -c $half-$(( cores - 1 ))"; fi
  else echo "env CUDA_VISIBLE_DEVICES=0"; fi
}
timed() {  # label budget_s cmd...: run, record rc and wall seconds
  local label=$1 budget=$2; shift 2
  local t0; t0=$(date +%s.%N)
  timeout "$budget" "$@"; local rc=$?
  say "$label rc=$rc wall_s=$(python3 -c "import time; print(round(time.time() - $t0, 1))")"
}
for part in .wheels/x1 .wheels/x2; do  # a half of FA4's wheels carried by this call (install_fa4 joins them)
  [ -d "$part" ] && mkdir -p /root/stage && cp "$part"/* /root/stage/ && echo "staged $part" >> "$W/session.txt"
done
say "call $call: $gpus GPU(s), $cores cores"
gate() { python3 -m gate "$@"; }
install_fa4() {  # FA4 from the staged halves (.wheels/x1, x2: evidence/h200/fa4_wheels.sh), once per warm machine;
  # sets fa4_new when this call installed it, and exports its PYTHONPATH whenever it is installed (CALL=3, 13-15)
  if [ ! -f /root/fa4-exports.sh ] && [ -f /root/stage/big.tar.xz.part1 ] && [ -f /root/stage/big.tar.xz.part2 ]; then
    exports=$(bash evidence/h200/fa4_wheels.sh install /root/stage /tmp/site 2> "$W/fa4-install.log") &&
      echo "$exports" > /root/fa4-exports.sh && say "FA4 installed" && fa4_new=1 || say "FA4 install failed (fa4-install.log)"
  fi
  [ -f /root/fa4-exports.sh ] && . /root/fa4-exports.sh
  python3 -c "import flash_attn.cute" > "$W/fa4-import.txt" 2>&1 && say "flash_attn.cute imports" || say "flash_attn.cute does NOT import"
}

refresh_pr() {  # the pr check wall-timed, the baseline refreshed from it, the check again (CALL=1, CALL=12)
  local L; L=$(lane 0); local d="$W/flash"; mkdir -p "$d/baselines"
  printf '[tool.attn-gate]\nbaselines_dir = "%s"\n' "$d/baselines" > "$d/pyproject.toml"
  timed "check-1 sdpa-flash pr vs committed baseline" 240 $L python3 -m gate check --kernel sdpa-flash --suite pr \
    --device cuda --baseline baselines/h200/sdpa-flash-pr.json --no-progress --out "$d/check1" > "$d/check1.log" 2>&1
  if [ ! -f "$d/check1/sweep-sdpa-flash-pr.json" ] && grep -qE "changed since the baseline" "$d/check1.log"; then
    # check-1 refused the committed baseline (another suite definition: new case ids) before sweeping: the same sweep
    # and speed run, without a comparison, is what the refresh records (not after a check-1 cut by its own timeout)
    timed "sweep sdpa-flash pr (no baseline to compare)" 200 $L python3 -m gate sweep --kernel sdpa-flash --suite pr \
      --device cuda --no-progress --out "$d/check1" > "$d/sweep1.log" 2>&1
    timed "perf sdpa-flash pr" 120 $L python3 -m gate perf --kernel sdpa-flash --suite pr --device cuda \
      --out "$d/check1" > "$d/perf1.log" 2>&1
  fi
  timed "baseline update from check-1" 60 $L python3 -m gate baseline update --config "$d/pyproject.toml" \
    --kernel sdpa-flash --suite pr --device cuda --from-results "$d/check1/sweep-sdpa-flash-pr.json" \
    --perf-from "$d/check1/perf-sdpa-flash-pr.json" --summary "$d/baseline-summary.md" > "$d/update.log" 2>&1
  local file; file=$(ls "$d"/baselines/*/sdpa-flash-pr.json 2>/dev/null | head -1)
  if [ -n "$file" ]; then
    timed "check-2 sdpa-flash pr vs refreshed baseline" 240 $L python3 -m gate check --kernel sdpa-flash --suite pr \
      --device cuda --baseline "$file" --no-progress --out "$d/check2" > "$d/check2.log" 2>&1
  fi
  grep -hE "^(PASS|FAIL|INCONCLUSIVE)" "$d"/check*.log | tee -a "$W/session.txt"
}

quiet_recheck() {  # FANOUT_QUIET_JOBS with nothing else on the GPU, QUIET_MAX_PROCS (1) shards at a time: e.g. the
  # ERROR rows of 2026-12-01c's shared-GPU sweeps, KERNEL:SUITE:SHARDS@evidence/h200/recheck/<file> (CALL=12, 15)
  [ -n "${FANOUT_QUIET_JOBS:-}" ] || return 0
  timed "fanout quiet recheck" $(( ${QUIET_BUDGET_S:-150} + 20 )) $(lane 0) python3 evidence/h200/fanout.py --state out/fanout \
    --out "$W/recheck" --device "${FANOUT_DEVICE:-cuda}" --max-procs "${QUIET_MAX_PROCS:-1}" --budget-s "${QUIET_BUDGET_S:-150}" \
    $(for j in $FANOUT_QUIET_JOBS; do echo --job "$j"; done) > "$W/recheck.log" 2>&1
  cat "$W/recheck/status.md" >> "$W/session.txt" 2>/dev/null
}

case "$call" in
1)
  lane0() { refresh_pr; }
  lane1() {
    local L; L=$(lane 1)
    timed "cudnn bias repro" 90 $L env OUT="$W/cudnn-repro" python3 evidence/h200/cudnn_bias_repro.py > "$W/cudnn-repro.log" 2>&1
    timed "bias sweeps efficient/cudnn/flex" 230 $L env OUT="$W/bias" BIAS_KERNELS=sdpa-efficient,sdpa-cudnn,flex \
      BIAS_BUDGET_S=200 python3 evidence/h200/bias_sweeps.py > "$W/bias.log" 2>&1
    timed "nightly shard 1/8 sdpa-flash --workers 1" 200 $L python3 -m gate sweep --kernel sdpa-flash --suite nightly \
      --device cuda --shard 1/8 --workers 1 --no-progress --out "$W/scale/w1" > "$W/scale-w1.log" 2>&1
  }
  if [ "$gpus" -ge 2 ]; then lane0 & lane1 & wait; else lane0; lane1; fi
  if [ "$gpus" -ge 2 ]; then
    timed "nightly shard 1/8 sdpa-flash --workers 2" 150 python3 -m gate sweep --kernel sdpa-flash --suite nightly \
      --device cuda --shard 1/8 --workers 2 --no-progress --out "$W/scale/w2" > "$W/scale-w2.log" 2>&1
  fi
  ;;
2)
  lane0() {
    timed "selftest correctness part" 520 $(lane 0) python3 -m gate selftest --kernel sdpa-flash --suite pr --device cuda \
      --no-slowdowns --out "$W/selftest-bugs" > "$W/selftest-bugs.log" 2>&1
  }
  lane1() {
    timed "selftest slowdown part" 520 $(lane 1) python3 -m gate selftest --kernel sdpa-flash --suite pr --device cuda \
      --bugs "${SLOWDOWN_BUG:-dk_x1.02}" --budget-s 490 --reps 5 --out "$W/selftest-slowdowns" > "$W/selftest-slowdowns.log" 2>&1
  }
  if [ "$gpus" -ge 2 ]; then lane0 & lane1 & wait; else lane0; fi
  ;;
3)
  install_fa4
  pieces() {  # L kernel budget regex...: a pr sweep in pieces, each written as it ends
    local L=$1 k=$2 deadline=$(( $(date +%s) + $3 )) i=0; shift 3
    for re in "$@"; do
      i=$((i + 1)); local left=$(( deadline - $(date +%s) ))
      if [ "$left" -lt 20 ]; then say "sweep $k piece $i ($re) not run: budget spent"; continue; fi
      mkdir -p "$W/sweeps/$k-$i"
      timed "sweep $k pr --only=$re" "$left" $L python3 -m gate sweep --kernel "$k" --suite pr --device cuda --no-progress \
        --out "$W/sweeps/$k-$i" "--only=$re" > "$W/sweeps/$k-$i/log.txt" 2>&1
    done
  }
  lane0() {
    local L; L=$(lane 0)
    timed "fa4 bias probe" 160 $L env OUT="$W/fa4-bias" python3 evidence/h200/fa4_bias_probe.py > "$W/fa4-bias.log" 2>&1
    timed "fa4 decode/sinks (entry part A)" 150 $L env OUT="$W/entry-fa4" ENTRY_PART=A ENTRY_LABELS='^fa4' ENTRY_BUDGET_S=130 \
      python3 evidence/h200/entry.py > "$W/entry-fa4.log" 2>&1
    pieces "$L" fa4 200 '^bf16.*-causal' '^bf16(?!.*-causal)' '^fp16'
    timed "fa4-raw-window" 60 $L python3 -m gate sweep --kernel fa4-raw-window --suite pr --device cuda --no-progress \
      --only=-win --out "$W/sweeps/fa4-raw-window" > "$W/fa4-raw-window.log" 2>&1
  }
  lane1() {
    local L; L=$(lane 1)
    timed "flex decode (entry part A)" 170 $L env OUT="$W/entry-flex" ENTRY_PART=A ENTRY_LABELS='^flex' ENTRY_BUDGET_S=160 \
      python3 evidence/h200/entry.py > "$W/entry-flex.log" 2>&1
    pieces "$L" sdpa-efficient 120 '^fp16(?!.*-causal)'
    pieces "$L" sdpa-cudnn 150 '^bf16(?!.*-causal)' '^fp16'
    pieces "$L" flex 100 '-win-1\.' '-(bhsd_view|dout_noncontig|qkv_packed)'
  }
  if [ "$gpus" -ge 2 ]; then lane0 & lane1 & wait; else lane0; fi
  ;;
4)
  # next session (carries .fa3): the selftest's planted slowdowns alone on GPU 0 (#13; the tiled
  # control is no longer swept for a kernel-hosted bug, d17c769), FA3 from the CPU-made build on GPU 1 (#10)
  lane0() {
    timed "selftest slowdown part" 540 $(lane 0) python3 -m gate selftest --kernel sdpa-flash --suite pr --device cuda \
      --bugs "${SLOWDOWN_BUG:-dk_x1.02}" --budget-s 500 --reps 5 --out "$W/selftest-slowdowns" > "$W/selftest-slowdowns.log" 2>&1
  }
  lane1() {
    timed "fa3 (evidence/h200/flash_build.sh)" 540 $(lane 1) env FA=fa3 OUT="$W" FA_BUDGET_S=300 FA_PERF_S=100 bash evidence/h200/flash_build.sh \
      > "$W/fa3.log" 2>&1
  }
  if [ "$gpus" -ge 2 ]; then lane0 & lane1 & wait; else lane0; fi
  ;;
5)
  # one GPU (only nvidia-h200 lent on 2026-12-01b): the whole selftest of sdpa-flash on pr in one run -
  # controls, every planted bug, then the planted slowdowns and the A/A control while the budget lasts (#13)
  timed "selftest sdpa-flash pr (whole)" 560 $(lane 0) python3 -m gate selftest --kernel sdpa-flash --suite pr \
    --device cuda --budget-s "${SELFTEST_BUDGET_S:-500}" --reps 5 --out "$W/selftest" > "$W/selftest.log" 2>&1
  grep -E "^selftest: (control|slowdowns|\[)" "$W/selftest.log" | tail -40 >> "$W/session.txt"
  ;;
6|7)
  # one GPU: FA3 (CALL=6, carries .fa3) or FA2 (CALL=7, carries .fa2) from the CPU-made builds (#10)
  fa=fa3; [ "$call" = 7 ] && fa=fa2
  timed "$fa (evidence/h200/flash_build.sh)" 560 $(lane 0) env FA=$fa OUT="$W" FA_BUDGET_S="${FA_BUDGET_S:-270}" \
    FA_PERF_S="${FA_PERF_S:-100}" bash evidence/h200/flash_build.sh > "$W/$fa.log" 2>&1
  cat "$W/$fa/status.txt" >> "$W/session.txt" 2>/dev/null
  ;;
8)
  # one GPU, carries .fa2: the FA2 repro of the pr failures (window (l, -1) with sq > sk; causal + ALiBi LSE),
  # then the bf16 causal piece of FA2's pr sweep again (CALL=7 wrote it into the folder of piece 2)
  python3 .fa2/unpack.py > "$W/fa2-unpack.txt" 2>&1
  timed "fa2 repro" 90 $(lane 0) env PYTHONPATH=.fa2 OUT="$W/fa2-repro" python3 evidence/h200/fa2_repro.py > "$W/fa2-repro.log" 2>&1
  cat "$W/fa2-repro.log" >> "$W/session.txt"
  timed "fa2 pr piece 1" 200 $(lane 0) env FA=fa2 FA_PIECES=1 FA_BUDGET_S=180 OUT="$W" bash evidence/h200/flash_build.sh \
    > "$W/fa2.log" 2>&1
  cat "$W/fa2/status.txt" >> "$W/session.txt" 2>/dev/null
  ;;
9)
  # one GPU, carries .fa3: FA3's bf16 causal pr piece again (as CALL=8 for FA2), then the whole nightly of
  # sdpa-flash - sweep and speed cases - wall-timed (#9's <= 30 min), the source of baselines/h200/sdpa-flash-nightly
  timed "fa3 pr piece 1" 120 $(lane 0) env FA=fa3 FA_PIECES=1 FA_BUDGET_S=110 OUT="$W" bash evidence/h200/flash_build.sh \
    > "$W/fa3.log" 2>&1
  cat "$W/fa3/status.txt" >> "$W/session.txt" 2>/dev/null
  d="$W/nightly"; mkdir -p "$d"
  timed "nightly sdpa-flash sweep" "${NIGHTLY_SWEEP_S:-330}" $(lane 0) python3 -m gate sweep --kernel sdpa-flash --suite nightly \
    --device cuda --no-progress --out "$d" > "$d/sweep.log" 2>&1
  timed "nightly sdpa-flash perf" 100 $(lane 0) python3 -m gate perf --kernel sdpa-flash --suite nightly --device cuda \
    --out "$d" > "$d/perf.log" 2>&1
  grep -hE "^(PASS|FAIL|INCONCLUSIVE)" "$d"/*.log | tee -a "$W/session.txt"
  ;;
10)
  # one GPU: the depth checks of FA3 (carry .fa3) then, in a second call, FA2 (CALL=11, carry .fa2) (#10)
  timed "fa3 depth" 200 $(lane 0) env FA=fa3 FA_DEPTH_ONLY=1 OUT="$W" bash evidence/h200/flash_build.sh > "$W/fa3.log" 2>&1
  cat "$W/fa3/status.txt" >> "$W/session.txt" 2>/dev/null
  ;;
11)
  timed "fa2 depth" 300 $(lane 0) env FA=fa2 FA_DEPTH_ONLY=1 OUT="$W" bash evidence/h200/flash_build.sh > "$W/fa2.log" 2>&1
  cat "$W/fa2/status.txt" >> "$W/session.txt" 2>/dev/null
  ;;
12)
  # one GPU: the pr baseline refreshed with [perf] anchor_fallback on, so the head-dim-256 speed cases the cuDNN
  # anchor refuses are timed against matmul (#9); nothing else on the GPU. Then FANOUT_QUIET_JOBS, if set.
  refresh_pr
  quiet_recheck
  ;;
13|14|15)
  # one GPU: many correctness sweeps side by side (evidence/h200/fanout.py: FANOUT_JOBS, each KERNEL:SUITE:SHARDS),
  # CALL=14 resuming what CALL=13 left (#9). FA4's wheels (~100 MB) travel in two halves (.wheels/x1, x2, each
  # staged by whichever call carries it; evidence/h200/fa4_wheels.sh), as the repo leaves ~45 MB of a call's 64 MiB;
  # the call that finds both installs FA4 and reproduces its GQA off-grid head-dim gradient failures in plain FA4.
  install_fa4
  if [ -n "${fa4_new:-}" ] && [ "${FA4_REPRO:-1}" = 1 ]; then  # FA4_REPRO=0: the repro ran in an earlier session
    timed "fa4 gqa head-dim repro" 150 $(lane 0) env OUT="$W/fa4-gqa-repro" python3 evidence/h200/fa4_gqa_headdim_repro.py \
      > "$W/fa4-gqa-repro.log" 2>&1 &
  fi
  if [ "$call" = 15 ]; then  # REPROS (plain-PyTorch probes, one after another, alone), then FANOUT_QUIET_JOBS
    for repro in ${REPROS:-}; do
      name=$(basename "$repro" .py)
      timed "repro $name" "${REPRO_BUDGET_S:-200}" $(lane 0) env OUT="$W/$name" python3 "$repro" > "$W/$name.log" 2>&1
      grep -vE "Warning|warn\(|^ +return|^ +warnings" "$W/$name.log" | tail -25 >> "$W/session.txt"
    done
    quiet_recheck
  fi
  if [ -n "${FANOUT_JOBS:-}" ] || [ "$call" != 15 ]; then  # CALL=15 without FANOUT_JOBS: the probes alone
    left=$(( ${CALL_BUDGET_S:-550} - ($(date +%s) - start) - 30 ))  # what the probes and the recheck left of the call
    fanout_s=${FANOUT_BUDGET_S:-500}; [ "$fanout_s" -gt "$left" ] && fanout_s=$left
    timed "fanout" $(( fanout_s + 15 )) $(lane 0) python3 evidence/h200/fanout.py --state out/fanout --out "$W/fanout" --device "${FANOUT_DEVICE:-cuda}" \
      --budget-s "$fanout_s" --max-procs "${FANOUT_MAX_PROCS:-0}" $(for j in ${FANOUT_JOBS:?FANOUT_JOBS=k:suite:n ...}; do echo --job "$j"; done) \
      > "$W/fanout.log" 2>&1
    cat "$W/fanout/status.md" >> "$W/session.txt" 2>/dev/null  # inside: a warm machine's folder may hold an older one
  fi
  wait
  tail -30 "$W/fa4-gqa-repro.log" >> "$W/session.txt" 2>/dev/null
  ;;
esac
say "done"
