#!/usr/bin/env bash
# FA3 or FA2 on the H200 from a trimmed build made on the CPU machine (issue #10; reports/fa3-build,
# reports/fa2-build): the build lives in the git-ignored .fa3/ or .fa2/ and is carried in the call.
#   .fa3: sm_90a, bf16/fp16, head dims 64 and 128, fwd+bwd, causal/window, varlen, paged, split,
#         append-KV; no softcap, FP8, pack-GQA, head dims above 128. The adapter reads its
#         flash_attn_config, so what the build lacks is SKIPPED with that reason.
#   .fa2: sm_90 (+PTX), bf16/fp16, head dims 64 and 128 only (any other head dim raises "not compiled":
#         those cases are ERROR rows, read them as the build's, not the kernel's), everything else FA2 has;
#         its .so travels xz-compressed and is unpacked first.
#
#   device call, carrying .fa3 (31 MiB) or .fa2 (44 MiB), one per call:
#       FA=fa3 bash evidence/h200/flash_build.sh          (< 9 min; everything in $OUT/fa3 or $OUT/fa2)
#
# 1. the load: glibc, `import flash_attn_interface` / `flash_attn`, one forward+backward against SDPA fp32;
# 2. the decode/paged/append cases of pr (flash_attn_with_kvcache), then the pr sweep in pieces,
#    each piece written as it ends (FA_BUDGET_S, default 300 s, for the sweeps);
# 3. the pr speed cases against the config's anchor (`attn-gate perf`, FA_PERF_S, default 120 s);
#    (FA_PIECES=1,3 runs only those pieces - 1 bf16 causal, 2 bf16 not causal, 3 fp16 - and stops there);
# 4. the depth checks (deterministic=True: ten runs bit-identical, the race hunt, batch invariance) on two
#    pr cases, FA2 also dropout's; FA_DEPTH_ONLY=1 runs this part alone (2026-12-01b ran determinism only).
# A short status table at the end; every part's rc and wall time are in $OUT/<fa>/status.txt.
set -uo pipefail
fa=${FA:?FA=fa3 or FA=fa2}
out=${OUT:-out/h200_$fa}/$fa; mkdir -p "$out"
export PYTHONPATH=.$fa:.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FA
[ "$fa" = fa2 ] && python3 .fa2/unpack.py > "$out/unpack.txt" 2>&1
status() { echo "$*" | tee -a "$out/status.txt"; }
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/pip.log" 2>&1
ldd --version 2>&1 | head -1 > "$out/glibc.txt"
python3 - > "$out/load.txt" 2>&1 <<'PY'
import os, torch
if os.environ["FA"] == "fa3":
    import flash_attn_interface as fa
    from flash_attn_config import CONFIG
    flags = {k: v for k, v in CONFIG["build_flags"].items() if v}
else:
    import flash_attn as fa
    flags = {"module": fa.__file__, "version": fa.__version__}
q, k, v = (torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = fa.flash_attn_func(q, k, v, causal=True)
out = out[0] if isinstance(out, tuple) else out
out.sum().backward()
ref = torch.nn.functional.scaled_dot_product_attention(*(t.detach().transpose(1, 2).float() for t in (q, k, v)), is_causal=True)
print(os.environ["FA"], "loads; max|out - sdpa fp32| =", (out.float() - ref.transpose(1, 2)).abs().max().item(), "dq finite:", bool(torch.isfinite(q.grad).all()))
print(flags)
PY
status "$fa load rc=$? $(tail -2 "$out/load.txt" | head -1) ($(cat "$out/glibc.txt"))"
sweep() {  # label budget extra-args...
  local label=$1 budget=$2; shift 2; mkdir -p "$out/$label"; local t0=$(date +%s)
  timeout "$budget" python3 -m gate sweep --kernel "$fa" --suite pr --device cuda --no-progress --out "$out/$label" "$@" \
    > "$out/$label/log.txt" 2>&1
  status "sweep $label rc=$? wall_s=$(( $(date +%s) - t0 ))"
}
# the .fa2 build has head dims 64 and 128 only (no config file says so): its sweeps keep to those cases
pre='^'; [ "$fa" = fa2 ] && pre='^(?=.*-d(64|128)(-|$))'
depth() {  # the depth checks: determinism, the race hunt at 4x the batch and batch invariance under
  # deterministic=True on two pr cases; FA2 (which has dropout) also the dropout checks on its pr dropout cases
  sweep depth 150 --only='^bf16-b2-h16/4-s2048-d128(-causal)?$' --checks determinism,race,batch_invariance
  [ "$fa" = fa2 ] && sweep dropout 120 "--only=${pre}.*-drop" --checks dropout
}
if [ -n "${FA_DEPTH_ONLY:-}" ]; then depth; echo; cat "$out/status.txt"; exit 0; fi  # FA_DEPTH_ONLY=1: the depth part alone
deadline=$(( $(date +%s) + ${FA_BUDGET_S:-300} ))
[ -z "${FA_PIECES:-}" ] && sweep decode 90 "--only=$pre.*-kv([\d.]|-|\$)"
# each piece gets its own folder (a label made from the regex alone gave two pieces one folder, and the
# second overwrote the first: 2026-12-01b, fixed then)
i=0
for piece in "${pre}bf16.*-causal" "${pre}bf16(?!.*-causal)" "${pre}fp16"; do
  i=$((i + 1)); [ -n "${FA_PIECES:-}" ] && [[ ",$FA_PIECES," != *",$i,"* ]] && continue
  left=$(( deadline - $(date +%s) )); [ "$left" -lt 20 ] && { status "sweep $piece not run: budget spent"; continue; }
  sweep "pr-$i-$(echo "$piece" | tr -dc 'a-z0-9')" "$left" "--only=$piece"
done
[ -n "${FA_PIECES:-}" ] && { echo; cat "$out/status.txt"; exit 0; }  # a re-run of pieces only
t0=$(date +%s)
timeout "${FA_PERF_S:-120}" python3 -m gate perf --kernel "$fa" --suite pr --device cuda --out "$out/perf" \
  > "$out/perf.log" 2>&1
status "perf rc=$? wall_s=$(( $(date +%s) - t0 ))"
depth
# (perf above times every pr speed case; with .fa2 the head-dim-256 ones are ERROR rows of the build)
echo; cat "$out/status.txt"
