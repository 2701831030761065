#!/usr/bin/env bash
# FA3 on the H200 from the trimmed build in .fa3/ (issue #10): made on a CPU machine by nvcc 13.0
# for sm_90a (bf16/fp16, head dims 64 and 128, fwd+bwd, causal/window, varlen, paged, split,
# append-KV; no softcap, FP8, pack-GQA, head dims above 128: .fa3/README.txt). The adapter reads
# .fa3/flash_attn_config.py, so what the build lacks is SKIPPED with that reason.
#
#   device call, carrying .fa3 (31 MiB):   bash evidence/h200/fa3.sh      (< 9 min; everything in $OUT/fa3)
#
# 1. the load: glibc (the .so needs >= 2.34), `import flash_attn_interface`, one forward+backward;
# 2. the decode/paged/append cases of pr (flash_attn_with_kvcache), then the pr sweep in pieces,
#    each piece written as it ends (FA3_BUDGET_S, default 300 s, for the sweeps);
# 3. the pr speed cases against the config's anchor (`attn-gate perf`, FA3_PERF_S, default 120 s);
# 4. the determinism check (deterministic=True: ten runs bit-identical) on two pr cases.
# A short status table at the end; every part's rc and wall time are in $OUT/fa3/status.txt.
set -uo pipefail
out=${OUT:-out/h200_fa3}/fa3; mkdir -p "$out"
export PYTHONPATH=.fa3:.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status() { echo "$*" | tee -a "$out/status.txt"; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/pip.log" 2>&1
ldd --version 2>&1 | head -1 > "$out/glibc.txt"
python3 - > "$out/load.txt" 2>&1 <<'PY'
import torch, flash_attn_interface as fa
from flash_attn_config import CONFIG
q, k, v = (torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = fa.flash_attn_func(q, k, v, causal=True)
out = out[0] if isinstance(out, tuple) else out
out.sum().backward()
ref = torch.nn.functional.scaled_dot_product_attention(*(t.detach().transpose(1, 2).float() for t in (q, k, v)), is_causal=True)
print("fa3 loads; max|out - sdpa fp32| =", (out.float() - ref.transpose(1, 2)).abs().max().item(), "dq finite:", bool(torch.isfinite(q.grad).all()))
print({k: v for k, v in CONFIG["build_flags"].items() if v})
PY
status "load rc=$? $(tail -2 "$out/load.txt" | head -1) ($(cat "$out/glibc.txt"))"
sweep() {  # label budget extra-args...
  local label=$1 budget=$2; shift 2; mkdir -p "$out/$label"; local t0=$(date +%s)
  timeout "$budget" python3 -m gate sweep --kernel fa3 --suite pr --device cuda --no-progress --out "$out/$label" "$@" \
    > "$out/$label/log.txt" 2>&1
  status "sweep $label rc=$? wall_s=$(( $(date +%s) - t0 ))"
}
deadline=$(( $(date +%s) + ${FA3_BUDGET_S:-300} ))
sweep decode 90 '--only=-kv([\d.]|-|$)'
for piece in '^bf16.*-causal' '^bf16(?!.*-causal)' '^fp16'; do
  left=$(( deadline - $(date +%s) )); [ "$left" -lt 20 ] && { status "sweep $piece not run: budget spent"; continue; }
  sweep "pr-$(echo "$piece" | tr -dc 'a-z0-9')" "$left" "--only=$piece"
done
t0=$(date +%s)
timeout "${FA3_PERF_S:-120}" python3 -m gate perf --kernel fa3 --suite pr --device cuda --out "$out/perf" \
  > "$out/perf.log" 2>&1
status "perf rc=$? wall_s=$(( $(date +%s) - t0 ))"
sweep determinism 60 --only='^bf16-b2-h16/4-s2048-d128(-causal)?$' --checks determinism
echo; cat "$out/status.txt"
