"""Standalone probe of FlexAttention's illegal memory access at 65,537 keys with a bias (H200), in
plain PyTorch with no attn-gate code. Written after 2026-12-01e; RAN on 2026-12-01f
(reports/h200/session-2026-12-01f, call1/): S = 46,340 and 46,341 agree with float64 (relative error
<= 0.0035 on every probed row, out and dQ, causal or not; dK/dV finite), and S = 65,537 faults in the
forward, causal or not ("CUDA driver error: an illegal memory access"). So plain FlexAttention faults
as the gate's sweep did: the two flex ERROR rows are FlexAttention's. The boundary is not 2**31 bias
elements (46,341**2 > 2**31 runs right) but lies between 46,341**2 and 65,537**2 > 2**32.
RAN with REPRO_SIZES=65536 on 2026-12-01g (reports/h200/session-2026-12-01g, call3/, 81 s): S*S = 2**32
exactly, every flat index under 2**32, and the forward still faults, causal or not. So the fault is not a
flat index wrapping at 2**32 either. A row offset q_idx * S computed in 32 bits would be one candidate:
it first overflows at S = 46,342 (46,341 * 46,342 > 2**31), one past the largest size that ran right.
RAN with REPRO_SIZES=46342,55000,65537 REPRO_CAUSAL=0 REPRO_READ=score_mod,mask_mod REPRO_OUTPUT_CODE=1 on
2026-12-01h (reports/h200/session-2026-12-01h, call2/, 199 s): the score_mod bias faults in the forward at
all three; the mask_mod at 46,342 runs without an error and returns wrong rows 46,340 and 46,341 (out
0.70 and 1.20, dQ 0.96 and 1.09; rows 0, 23,171, 32,767, 32,768 <= 0.0041), and faults at 55,000 and
65,537. The generated kernels (output-code-*.log.gz there) show the cause: flex's template sets
INDEX_DTYPE = tl.int32 and reads the captured tensor at `in_ptr + kv + 46342*q` with q (offs_m) in 32
bits, which wraps from q = 46,340 on (46,340 * 46,342 > 2**31 - 1): of the six rows probed, exactly the
two that came out wrong.
The block-mask build's kernel indexes in 64 bits. The class of NeMo Automodel PR #3802 (a flex mask_mod
lookup wrong past ~46k tokens, faulting at 64k).

REPRO_READ=mask_mod reads a random boolean (1, 1, S, S) mask (9 keys in 10 allowed, the diagonal always)
through a mask_mod instead, as the adapter reads a boolean bias such as the nightly's document mask,
with a compiled block mask: whether flex's long-tensor fault reaches that read too (the gate's
`bf16-b1-h2-s65537-d64-bias.document` row, whose 2026-12-01g out-of-memory was the adapter's). It does
(2026-12-01h, above), and the document row, with its block mask now built compiled, faults too (an illegal
memory access, reported asynchronously in the sweep).

    REPRO_SIZES=46342,55000,65537 REPRO_CAUSAL=0 REPRO_READ=score_mod,mask_mod REPRO_OUTPUT_CODE=1 \
      python3 evidence/h200/flex_long_bias_repro.py      # 6 runs: 199 s on 2026-12-01h

The flex nightly of 2026-12-01e (reports/h200/session-2026-12-01e) ERRORed both
`bf16-b1-h2-s65537-d64[-causal]-bias.broadcast_1` cases with "CUDA error: an illegal memory access".
FlexAttention reads that bias through a score_mod that captures a (1, 1, S, S) tensor, so the
generated Triton kernels index it at q_idx * S + kv_idx. At S = 65,537 that flat index passes
2**31 - 1 from query row 32,768 on, and 2**32 from row 65,536 on. The first guess was the class of
pytorch #190857 (flex faults once a flattened offset exceeds INT32_MAX); 46,341 running right rules
that boundary out here, so it is an offset past 2**32 or something else that grows with S. The
gate's fa4 and sdpa-cudnn pass the same cases.

No float64 reference of the whole 65k x 65k problem is needed: a query row's output and dQ depend on
that row alone (out_i = softmax(s_i) V, dq_i = scale * dS_i K with dS_i = P_i * (dO_i V^T - dO_i . out_i)),
so the probe checks a few rows on both sides of each boundary (0, 32,767, 32,768, 46,340, 65,535, 65,536
and the last) against a float64 computation from the same bf16 inputs and a bias drawn at random
(varying along each row, so a read from a wrong row or column shows; a read wrapped by exactly 2**32
lands on another row shifted by one column, which a row-constant bias could not see). The error is
relative to the reference row's largest entry; where that row is exactly zero (dQ of causal row 0,
which sees one key) it is the absolute error instead (2026-12-01f printed "inf" there). It also says
whether dK/dV are finite. S = 46,340 (S*S < 2**31), 46,341 (just over) and 65,537, causal or not,
each in a process of its own with CUDA_LAUNCH_BLOCKING=1 (a fault poisons the context and is then
reported by the call that made it: forward or backward). Each row is printed and the JSON rewritten as
its run ends, so a cut run keeps what it finished:

    python3 evidence/h200/flex_long_bias_repro.py      # ~6 compiles: 165 s on 2026-12-01f (REPRO_BUDGET_S=360)
    REPRO_SIZES=65536 python3 evidence/h200/flex_long_bias_repro.py                   # 81 s on 2026-12-01g
    REPRO_SIZES=64,65 REPRO_DEVICE=cpu python3 evidence/h200/flex_long_bias_repro.py         # rehearsal
    REPRO_SIZES=64 REPRO_DEVICE=cpu REPRO_PLANT_SHIFT=1 python3 ...   # the bias read one row off: must differ
    REPRO_SIZES=65 REPRO_DEVICE=cpu REPRO_READ=score_mod,mask_mod [REPRO_PLANT_SHIFT=1] python3 ...  # both reads
    (on the CPU: <= 0.0043 as read; 0.27-1.9 one row off)

GPU memory per run: the bias (S*S bf16: 8.6 GB at 65,537; a bool mask 4.3 GB, drawn from 17 GB of float32)
and the compiled block mask; q/k/v are small.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from repro_child import emit, first_line, row_error, run_variant  # sibling: one process per variant

DEVICE = os.environ.get("REPRO_DEVICE", "cuda")
SIZES = [int(s) for s in os.environ.get("REPRO_SIZES", "46340,46341,65537").split(",")]
CAUSAL = [c == "1" for c in os.environ.get("REPRO_CAUSAL", "0,1").split(",")]  # 0: full, 1: causal
READS = os.environ.get("REPRO_READ", "score_mod").split(",")  # score_mod: a bf16 bias added; mask_mod: a bool mask
if not set(READS) <= {"score_mod", "mask_mod"}:
    sys.exit(f"REPRO_READ={','.join(READS)!r}: expected score_mod, mask_mod or both, comma-separated")
VARIANTS = [(s, causal, read) for read in READS for s in SIZES for causal in CAUSAL]
OUTPUT_CODE = os.environ.get("REPRO_OUTPUT_CODE", "0") == "1"  # keep each run's generated Triton code (TORCH_LOGS)
RUN_TIMEOUT_S = float(os.environ.get("REPRO_RUN_TIMEOUT_S", "300"))
PLANT_SHIFT = int(os.environ.get("REPRO_PLANT_SHIFT", "0"))  # rehearsal only: the bias read this many rows off


def probe_rows(seqlen: int) -> list[int]:
    """Rows on both sides of each 32-bit boundary of q_idx * seqlen, that exist at this length."""
    wanted = {0, 32767, 32768, 46340, 65535, 65536, seqlen // 2, seqlen - 1}
    return sorted(r for r in wanted if r < seqlen)


def reference_rows(q, k, v, dout, row_bias, rows: list[int], causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 out and dQ of the given query rows (heads kept), from the bf16 inputs; row_bias is the
    (len(rows), S) float64 addend of those rows (the bias, or 0 / -inf for a boolean mask)."""
    qr, kk, vv, dor = (t.double() for t in (q[0][:, rows], k[0], v[0], dout[0][:, rows]))
    scores = torch.einsum("hid,hjd->hij", qr, kk) * scale + row_bias
    if causal:
        cols = torch.arange(kk.shape[1], device=kk.device)
        scores = scores.masked_fill(cols[None, None, :] > torch.tensor(rows, device=kk.device)[None, :, None], float("-inf"))
    p = scores.softmax(dim=-1)
    out = torch.einsum("hij,hjd->hid", p, vv)
    dp = torch.einsum("hid,hjd->hij", dor, vv)
    ds = p * (dp - (dor * out).sum(-1, keepdim=True))
    return out, torch.einsum("hij,hjd->hid", ds, kk) * scale


def run(seqlen: int, causal: bool, read: str) -> dict:
    heads, head_dim, dtype = 2, 64, torch.bfloat16
    scale = head_dim ** -0.5
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, dout = (torch.randn(1, heads, seqlen, head_dim, device=DEVICE, dtype=dtype, generator=gen) for _ in range(4))
    if read == "score_mod":
        bias = torch.randn(1, 1, seqlen, seqlen, device=DEVICE, dtype=dtype, generator=gen)
    else:  # a random boolean mask (9 in 10 keys allowed, the diagonal always), read as the adapter reads one
        bias = torch.rand(1, 1, seqlen, seqlen, device=DEVICE, generator=gen) < 0.9
        bias[0, 0].diagonal().fill_(True)
    grads = DEVICE != "cpu"  # flex has no backward on the CPU: the rehearsal checks the forward only

    def bias_at(q_idx, kv_idx):  # the read the gate's flex adapter makes; PLANT_SHIFT (rehearsal only) reads a wrong row
        return bias[0, 0, (q_idx + PLANT_SHIFT) % seqlen if PLANT_SHIFT else q_idx, kv_idx]

    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias_at(q_idx, kv_idx)

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def read_mask(b, h, q_idx, kv_idx):
        ok = bias_at(q_idx, kv_idx)
        return ok & causal_mask(b, h, q_idx, kv_idx) if causal else ok

    row = {"seqlen": seqlen, "causal": causal, "read": read, "flat_bias_elements": seqlen * seqlen,
           "past_int31": seqlen * seqlen > 2**31 - 1, "plant_shift": PLANT_SHIFT}
    phase = "block mask"
    try:
        mask_mod = read_mask if read == "mask_mod" else causal_mask if causal else None
        block_mask = None
        if mask_mod is not None:  # compiled: the eager build materialises several S x S tensors
            block_mask = torch.compile(create_block_mask)(mask_mod, None, None, seqlen, seqlen, device=DEVICE)
        leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
        phase = "forward"
        out = torch.compile(flex_attention, dynamic=False)(*leaves, score_mod=add_bias if read == "score_mod" else None,
                                                           block_mask=block_mask, scale=scale)
        torch.cuda.synchronize() if DEVICE == "cuda" else None
        phase = "backward"
        if grads:
            out.backward(dout)
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a fault is the row's finding
        row["error"] = f"{phase}: {first_line(exc)}"
        return row
    rows = probe_rows(seqlen)
    if read == "score_mod":
        row_bias = bias[0, 0, rows].double()
    else:
        row_bias = torch.zeros(len(rows), seqlen, dtype=torch.float64, device=DEVICE).masked_fill(~bias[0, 0, rows], float("-inf"))
    ref_out, ref_dq = reference_rows(q, k, v, dout, row_bias, rows, causal, scale)
    row["rows"] = rows
    row["out_rel_err"] = [row_error(out[0][:, r], ref_out[:, i]) for i, r in enumerate(rows)]
    if grads:
        dq = leaves[0].grad[0]
        row["dq_rel_err"] = [row_error(dq[:, r], ref_dq[:, i]) for i, r in enumerate(rows)]
        row["dk_finite"] = bool(torch.isfinite(leaves[1].grad).all())
        row["dv_finite"] = bool(torch.isfinite(leaves[2].grad).all())
    return row


def describe(r: dict) -> str:
    head = f"S={r['seqlen']:6} {'causal' if r['causal'] else 'full  '} {r.get('read', 'score_mod'):9}"
    if "error" in r:
        return f"{head} {r['error']}"
    def fmt(e: float | None) -> str:
        return "non-finite" if e is None else f"{e:.2g}"

    dq = r.get("dq_rel_err")
    parts = [f"row {row}: out {fmt(o)}" + (f" dq {fmt(dq[i])}" if dq else "")
             for i, (row, o) in enumerate(zip(r["rows"], r["out_rel_err"]))]
    finite = "" if "dk_finite" not in r else f" | dK finite {r['dk_finite']}, dV finite {r['dv_finite']}"
    return f"{head} " + "; ".join(parts) + finite


def main() -> None:
    if len(sys.argv) > 1:
        emit(run(*VARIANTS[int(sys.argv[1])]))
        return
    out_dir = Path(os.environ.get("OUT") or "out/h200_flex_long_bias")
    out_dir.mkdir(parents=True, exist_ok=True)
    print("flex_attention with a random (1, 1, S, S) bf16 bias read by a score_mod, or bool mask by a mask_mod: "
          "relative error of chosen query rows against float64 from the same inputs", flush=True)
    rows = []
    for i, (seqlen, causal, read) in enumerate(VARIANTS):
        env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1", **({"TORCH_LOGS": "output_code"} if OUTPUT_CODE else {})}
        row, proc = run_variant([sys.executable, __file__, str(i)], {"seqlen": seqlen, "causal": causal, "read": read},
                                RUN_TIMEOUT_S, env)
        if OUTPUT_CODE and proc is not None:  # the kernels inductor generated, to read how the bias read is indexed
            (out_dir / f"output-code-{read}-s{seqlen}-{'causal' if causal else 'full'}.log").write_text(proc.stderr)
        rows.append(row)
        print(describe(row), flush=True)
        (out_dir / "flex-long-bias-repro.json").write_text(json.dumps({"schema_version": 3, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
