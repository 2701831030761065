#!/usr/bin/env bash
# The correctness half of the H200 check, in one device call: the sweep of SUITE (default pr) for
# each kernel, all kernels at once as separate processes (a correctness sweep is not a timing run,
# and Flex's compiles are CPU-bound), then a table. Everything lands in $OUT/sweeps.tar.gz.
# Produces reports/h200/sweep-<kernel>-<suite>.json and validation-<kernel>-<suite>.md (from the archive).
#   usage: PYTHONPATH=. bash evidence/h200/sweeps.sh [SUITE] [KERNEL...]
set -uo pipefail
suite=${1:-pr}; shift || true
kernels=("$@"); [ ${#kernels[@]} -gt 0 ] || kernels=(sdpa-flash sdpa-cudnn sdpa-efficient flex fa4)
out=${OUT:-/tmp/out}/sweeps; mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-.}:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > "$out/nvidia-smi.txt" 2>&1
start=$(date +%s)
for k in "${kernels[@]}"; do
  ( t0=$(date +%s); timeout "${SWEEP_TIMEOUT_S:-540}" python3 -m gate sweep --kernel "$k" --suite "$suite" --out "$out" > "$out/log-$k.txt" 2>&1
    echo "$k rc=$? wall_s=$(( $(date +%s) - t0 ))" >> "$out/status.txt" ) &
done
wait
echo "all sweeps: $(( $(date +%s) - start )) s" >> "$out/status.txt"
cat "$out/status.txt"
for k in "${kernels[@]}"; do grep -E "^(PASS|FAIL):|error:" "$out/log-$k.txt" | tail -2; grep -E "FAIL|ERROR" "$out/log-$k.txt" | head -8; done
tar -czf "${OUT:-/tmp/out}/sweeps.tar.gz" -C "$(dirname "$out")" sweeps
