"""Standalone probe of FA4's illegal memory access at 65,537 tokens with a mask_mod reading a (1, 1, S, S)
uint8 mask (H200), in plain PyTorch and flash-attn-4 (`flash_attn.cute`) with no attn-gate code, so it can
be filed upstream as is. Written after 2026-12-01f; RAN on 2026-12-01g (reports/h200/session-2026-12-01g,
call2/, all 11 runs in 247 s, FA4 4.0.0b36, torch 2.11): hypothesis (2) below holds.
  mask_mod      faults in the forward (cudaErrorIllegalAddress) at S = 46,341, 65,536 and 65,537: the three
                sizes tried with a partial last query tile (46,341 = 241 x 192 + 69, 65,536 = 341 x 192 + 64;
                65,536 is a multiple of 128, so the tile is FA4's 192 rows)
  mask_wrapped  the same read with indices taken modulo S: runs right at 65,537
  mask_mod at S = 65,664 (no partial tile, more elements than 65,537): runs right, so (1) is ruled out
  score_mod and doc_ids: run right at all three sizes
Every row that ran: out and dQ within 0.0044 of float64 (relative to the row's largest entry), dK and dV
finite. So the nightly's `bf16-b1-h2-s65537-d64-bias.document` ERROR is FA4's: its SM90 forward hands a
mask_mod the unwrapped rows of a partial last query tile, whose reads leave the mask's allocation.

Why: `bf16-b1-h2-s65537-d64-bias.document` (batch 1, 2 heads, head dim 64, bf16, non-causal, a document-
packing boolean mask) ERRORed in the FA4 nightly of 2026-12-01e (out of memory beside 15 other sweeps) and
again in 2026-12-01f alone on the GPU (reports/h200/session-2026-12-01f, call2 recheck): "CUDA error: an
illegal memory access", surfacing at the first look at the forward's output. The gate hands FA4 that mask as
a uint8 (1, 1, S, S) aux tensor read by a CuTe mask_mod at [0, 0, q_idx, kv_idx]. The same size with a bf16
(1, 1, S, S) bias read by a score_mod passed, and FA4's boolean-mask rows pass up to 1,088 keys in the
nightly and 4,096 in pr.

Two hypotheses. (1) A 32-bit index or offset for the aux read: the flat index q_idx * S + kv_idx passes
2**31 - 1 at S = 46,341, reaches 2**32 - 1 at 65,536 and passes 2**32 at 65,537. Against it: FA4 converts
aux tensors with dynamic 64-bit strides (cute_dsl_utils.py to_cute_aux_tensor: from_dlpack, then
mark_layout_dynamic), and the bf16 score_mod read with the same element offsets passes. (2) An
out-of-bounds read (read in the 4.0.0b36 wheel's source; the 2026-12-01g run bore out what it predicts,
above): FA4's score_mod path takes every index
modulo the sequence length before calling the mod ("in order to not read OOB", softmax.py), but its SM90
forward mask path (mask.py apply_mask) wraps only when mask_seqlen is set, i.e. on the key tile that masks
the sequence end; on every other key tile the rows of the last, partial query tile (192 rows for d64:
65,472-65,663 at S = 65,537) reach mask_mod unwrapped, so mask[0, 0, q, kv] is read up to ~8 MB past the
end of the tensor. The results of those rows are discarded, but the load can fault once it leaves the
allocation: at the sizes that pass (S <= 4,096) a partial tile's extra rows read under ~1 MB past the
mask, likely memory the caching allocator holds anyway (not measured). flash-attention PR #2091 ("Fix IMA in fwd on m boundary") fixed this gating for
SM100 only. If (2) holds, the fault is FA4's (the wrap is its documented job; gate/kernels/fa4_mods.py
said FA4 wraps boundary indices for every mod, since corrected),
and an adapter could guard with the index modulo S.

Variants, each in a process of its own (a fault poisons the CUDA context; CUDA_LAUNCH_BLOCKING=1, so the
faulting call is the one named), most telling first (DEFAULT_VARIANTS):
  mask_mod      the gate's read: uint8 (1, 1, S, S) mask, the gate's documents (same seed), 4.3 GB at 65,537
  mask_wrapped  the same read with q_idx and kv_idx taken modulo S first: passes where mask_mod faults = (2)
  mask_mod at S = 65,664 (342 x 192 = 513 x 128): past 2**32 elements, no partial query tile: passes = (2),
                faults = (1)
  score_mod     the contrast that passed in the gate: a random bf16 (1, 1, S, S) bias, 8.6 GB at 65,537
  doc_ids       the same documents through FA4's own idiom (its cute_document_mask): a mask_mod reading an
                int32 (1, 1, S) document id per token (an overshoot of (2) is ~0.5 KB there)
and mask_mod / score_mod / doc_ids at 46,341 and 65,536. For each: forward and backward (random dO) through
flash_attn.cute.flash_attn_func; query rows on both sides of each boundary (0, 32767, 32768, S//2, 46340,
65535, 65536, S-1 where < S) against float64 from the same bf16 inputs. Row i of out and dQ depends only
on row i of q and dO, all of k and v, and row i of the mask or bias (out_i = P_i V, dq_i = scale * dS_i K,
dS_i = P_i * (dO_i V^T - dO_i . out_i)), so no S x S reference is built. Errors are relative to the
reference row's largest entry (absolute where that row is zero); dK/dV are only checked finite. bf16
agreement is ~1e-2 or better. The sanitizer run (not run yet) would show (2) directly at a small S: an
"Invalid __global__ read of size 1" past the mask's allocation in the forward with mask_mod, none with
score_mod.

    REPRO_BUDGET_S=420 python3 evidence/h200/fa4_long_mask_repro.py    # 11 runs: 247 s on 2026-12-01g
    REPRO_SIZES=65537 REPRO_MODES=mask_mod,mask_wrapped python3 ...     # only the decisive pair
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 REPRO_SIZES=1000 REPRO_MODES=mask_mod,score_mod \
      REPRO_WRAPPER="/usr/local/cuda-13.0/bin/compute-sanitizer --tool memcheck" python3 ...
    REPRO_PLANT=1 REPRO_SIZES=46341 python3 ...   # rehearsal: reference reads row i + S//2: errors ~1
    python3 evidence/h200/fa4_long_mask_repro.py --self-check          # CPU: the row reference vs dense
Each row is printed and $OUT/fa4-long-mask-repro.json rewritten as its run ends; REPRO_BUDGET_S (the wall
limit the session gives the script) shortens the last runs' timeouts and marks runs it leaves undone.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path

try:
    import torch
except ImportError:
    sys.exit("fa4_long_mask_repro: needs PyTorch (import torch failed)")

from repro_child import emit, first_line, row_error, run_variant  # sibling: one process per variant

try:  # FA4 and its CuTe DSL: absent on a CPU machine, where only --self-check runs
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import flash_attn_func
    FA4_MISSING = ""
except Exception as exc:  # noqa: BLE001 - any failure to import is the same answer: no FA4 here
    FA4_MISSING = f"flash_attn.cute does not import ({type(exc).__name__}: {str(exc)[:120]})"

KNOWN_MODES = ("mask_mod", "mask_wrapped", "score_mod", "doc_ids")
# Default order, most telling first so a cut run keeps it: the gate's fault; the same read with the row
# index wrapped into range (the out-of-bounds hypothesis, below); 65,664 = 342 x 192 = 513 x 128 rows, past
# 2**32 elements but with no partial query tile; the score_mod contrast; then the other sizes and doc_ids.
DEFAULT_VARIANTS = [(65537, "mask_mod"), (65537, "mask_wrapped"), (65664, "mask_mod"), (65537, "score_mod"),
                    (46341, "mask_mod"), (65536, "mask_mod"), (65537, "doc_ids"), (46341, "score_mod"),
                    (65536, "score_mod"), (46341, "doc_ids"), (65536, "doc_ids")]
MODES = os.environ.get("REPRO_MODES", ",".join(KNOWN_MODES)).split(",")
if os.environ.get("REPRO_SIZES") or os.environ.get("REPRO_MODES"):  # a chosen product, smallest S first
    SIZES = sorted(int(s) for s in os.environ.get("REPRO_SIZES", "46341,65536,65537").split(","))
    VARIANTS = [(s, m) for s in SIZES for m in MODES]
else:
    VARIANTS = DEFAULT_VARIANTS
# e.g. "/usr/local/cuda-13.0/bin/compute-sanitizer --tool memcheck": put before each child's command; its
# "=========" lines are kept in the row (run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 and a small S)
WRAPPER = os.environ.get("REPRO_WRAPPER", "").split()
RUN_TIMEOUT_S = float(os.environ.get("REPRO_RUN_TIMEOUT_S", "240"))
BUDGET_S = float(os.environ.get("REPRO_BUDGET_S") or 0)  # 0: no overall limit
PLANT = os.environ.get("REPRO_PLANT", "0") == "1"  # rehearsal: the reference reads row (i + S//2) % S
HEADS, HEAD_DIM = 2, 64
BUILD_ROWS = 4096  # rows of the mask / bias built at a time (a 65,537-key chunk: 268 MB of bool)

if not FA4_MISSING:
    # The gate's mods (gate/kernels/fa4_mods.py, inlined): FA4 4.0.0b36 calls them one score at a time when
    # aux_tensors are given, each index a one-element TensorSSA; a broadcast dimension is read at index * 0.
    @cute.jit
    def mask_from_uint8(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        mask = aux_tensors[0]
        allowed = cute.make_rmem_tensor(1, cutlass.Boolean)
        allowed[0] = cutlass.Int32(mask[batch_idx[0] * 0, head_idx[0] * 0, q_idx[0], kv_idx[0]]) != cutlass.Int32(0)
        return allowed.load()

    @cute.jit
    def mask_from_doc_ids(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        doc = aux_tensors[0]
        allowed = cute.make_rmem_tensor(1, cutlass.Boolean)
        allowed[0] = (cutlass.Int32(doc[batch_idx[0] * 0, head_idx[0] * 0, q_idx[0]])
                      == cutlass.Int32(doc[batch_idx[0] * 0, head_idx[0] * 0, kv_idx[0]]))
        return allowed.load()

    @cute.jit
    def add_bias(score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        bias = aux_tensors[0]
        value = cute.make_rmem_tensor(1, bias.element_type)
        value[0] = bias[batch_idx[0] * 0, head_idx[0] * 0, q_idx[0], kv_idx[0]]
        return score + value.load().to(cutlass.Float32)

    @cute.jit
    def pass_grad(grad, score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return grad

    def mask_wrapped_into_range(seqlen: int):
        """The gate's read with both indices taken modulo S first: what FA4's score_mod path does to every
        index it hands a mod (softmax.py), and its SM90 forward mask path only on the tile it masks for
        the sequence end, so rows past S on the last query tile reach mask_mod unwrapped (the hypothesis)."""
        @cute.jit
        def mask_from_uint8_wrapped(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
            mask = aux_tensors[0]
            allowed = cute.make_rmem_tensor(1, cutlass.Boolean)
            allowed[0] = cutlass.Int32(mask[batch_idx[0] * 0, head_idx[0] * 0, q_idx[0] % seqlen,
                                            kv_idx[0] % seqlen]) != cutlass.Int32(0)
            return allowed.load()
        return mask_from_uint8_wrapped

    MOD_KWARGS = {"mask_mod": lambda s: dict(mask_mod=mask_from_uint8),
                  "mask_wrapped": lambda s: dict(mask_mod=mask_wrapped_into_range(s)),
                  "doc_ids": lambda s: dict(mask_mod=mask_from_doc_ids),
                  "score_mod": lambda s: dict(score_mod=add_bias, score_mod_bwd=pass_grad)}


def document_ids(seqlen: int, device) -> torch.Tensor:
    """int32 (S,) document of each token: the gate's 'document' pattern for a one-batch S x S case
    (gate/attention/bias.py, same seed), documents of S/8 .. S/2 tokens packed back to back."""
    gen = torch.Generator(device="cpu").manual_seed(seqlen * 7919 + seqlen * 104729 + 1)
    starts, at = [0], 0
    lo, hi = max(1, seqlen // 8), max(2, seqlen // 2)
    while True:
        at += int(torch.randint(lo, hi + 1, (1,), generator=gen))
        if at >= seqlen:
            break
        starts.append(at)
    ids = torch.searchsorted(torch.tensor(starts), torch.arange(seqlen), right=True) - 1
    return ids.to(torch.int32).to(device)


def build_aux(mode: str, seqlen: int, gen: torch.Generator, device, chunk: int = BUILD_ROWS) -> torch.Tensor:
    """The aux tensor FA4 reads, built `chunk` rows at a time (no S x S temporary beyond one chunk)."""
    doc = document_ids(seqlen, device)
    if mode == "doc_ids":
        return doc.view(1, 1, seqlen).contiguous()
    if mode in ("mask_mod", "mask_wrapped"):
        aux = torch.empty(1, 1, seqlen, seqlen, dtype=torch.uint8, device=device)
        for r0 in range(0, seqlen, chunk):
            aux[0, 0, r0:r0 + chunk] = doc[r0:r0 + chunk, None] == doc[None, :]  # bool -> 1 / 0
        return aux
    aux = torch.empty(1, 1, seqlen, seqlen, dtype=torch.bfloat16, device=device)
    for r0 in range(0, seqlen, chunk):
        aux[0, 0, r0:r0 + chunk].normal_(generator=gen)
    return aux


def additive_rows(mode: str, aux: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """float64 (R, S) added to the scaled scores of `rows`: 0 / -inf from the mask, or the bias."""
    if mode == "score_mod":
        return aux[0, 0, rows].double()
    allowed = aux[0, 0, rows] != 0 if aux.dim() == 4 else aux[0, 0, rows][:, None] == aux[0, 0][None, :]
    return torch.zeros(allowed.shape, dtype=torch.float64, device=aux.device).masked_fill(~allowed, float("-inf"))


def reference_rows(q, k, v, dout, additive, rows: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 out and dQ, (R, H, D), of the query rows `rows` from the (1, S, H, D) bf16 inputs."""
    qr, kk, vv, dor = (t.double() for t in (q[0, rows], k[0], v[0], dout[0, rows]))
    p = (torch.einsum("rhd,shd->hrs", qr, kk) * scale + additive[None]).softmax(dim=-1)
    out = torch.einsum("hrs,shd->rhd", p, vv)
    dp = torch.einsum("rhd,shd->hrs", dor, vv)
    ds = p * (dp - (dor * out).sum(-1).transpose(0, 1)[..., None])
    return out, torch.einsum("hrs,shd->rhd", ds, kk) * scale


def probe_rows(seqlen: int) -> list[int]:
    """Rows on both sides of each 32-bit boundary of q_idx * S + kv_idx, that exist at this length."""
    return sorted(r for r in {0, 32767, 32768, 46340, 65535, 65536, seqlen // 2, seqlen - 1} if r < seqlen)


def read_rows(rows: list[int], seqlen: int) -> list[int]:
    """The mask / bias rows the reference uses: the same, or (rehearsal) half the sequence away."""
    return [(r + seqlen // 2) % seqlen for r in rows] if PLANT else rows


def run(seqlen: int, mode: str) -> dict:
    """One variant on the GPU (a child process): build, forward, backward, then the row checks."""
    scale, device = HEAD_DIM ** -0.5, "cuda"
    row = {"seqlen": seqlen, "mode": mode, "device": torch.cuda.get_device_name(),
           "aux_elements": seqlen if mode == "doc_ids" else seqlen * seqlen, "plant": PLANT}
    seconds, phase, clock = {}, "build", [time.time()]

    def lap(name: str) -> None:  # the seconds of the phase just ended (forward and backward include compiling)
        torch.cuda.synchronize()
        seconds[name], clock[0] = round(time.time() - clock[0], 1), time.time()

    try:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, dout = (torch.randn(1, seqlen, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
                         for _ in range(4))
        aux = build_aux(mode, seqlen, gen, device)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        lap(phase)
        phase = "forward"  # the keyword arguments the gate's fa4 adapter passes for this case
        result = flash_attn_func(*leaves, softmax_scale=scale, causal=False, window_size=(None, None),
                                 return_lse=True, aux_tensors=[aux], **MOD_KWARGS[mode](seqlen))
        out = result[0] if isinstance(result, tuple) else result  # FA4 returns (out, lse)
        lap(phase)
        phase = "backward"
        out.backward(dout)
        lap(phase)
        phase = "reference"
        rows = probe_rows(seqlen)
        ref_out, ref_dq = reference_rows(q, k, v, dout, additive_rows(mode, aux, read_rows(rows, seqlen)), rows, scale)
        got_out, got_dq = out.detach()[0, rows], leaves[0].grad[0, rows]
        row.update(rows=rows, out_err=[row_error(got_out[i], ref_out[i]) for i in range(len(rows))],
                   dq_err=[row_error(got_dq[i], ref_dq[i]) for i in range(len(rows))],
                   dk_finite=bool(torch.isfinite(leaves[1].grad).all()),
                   dv_finite=bool(torch.isfinite(leaves[2].grad).all()))
    except Exception as exc:  # noqa: BLE001 - a fault or refusal is the row's finding
        row["error"] = f"{phase}: {first_line(exc)}"
    row["seconds"] = seconds
    return row


def fmt(e: float | None) -> str:
    return "non-finite" if e is None else f"{e:.2g}"


def describe(r: dict) -> str:
    head = f"S={r['seqlen']:6} {r['mode']:12}"
    tail = "".join(f"\n    {line}" for line in r.get("sanitizer", []))
    if "error" in r:
        return f"{head} {r['error']}{tail}"
    parts = [f"row {row}: out {fmt(o)} dq {fmt(d)}" for row, o, d in zip(r["rows"], r["out_err"], r["dq_err"])]
    return f"{head} " + "; ".join(parts) + f" | dK finite {r['dk_finite']}, dV finite {r['dv_finite']}" + tail


def self_check(seqlen: int = 70) -> int:
    """CPU, no FA4: the row reference against dense float64 softmax(QK^T * scale + add) V with dQ from
    autograd, all rows, each mode; then the dense result rounded to bf16 through row_error, as a kernel
    would be judged. Exit 0 when they agree (or, with REPRO_PLANT=1, when every mode disagrees)."""
    scale, gen = HEAD_DIM ** -0.5, torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, seqlen, HEADS, HEAD_DIM, dtype=torch.bfloat16, generator=gen) for _ in range(4))
    doc, rows, verdicts = document_ids(seqlen, "cpu"), list(range(seqlen)), []
    print(f"self-check S={seqlen} (documents start at {[0] + [i for i in rows[1:] if doc[i] != doc[i - 1]]}), "
          f"plant={PLANT}: row reference vs dense float64 + autograd", flush=True)
    for mode in ("mask_mod", "doc_ids", "score_mod"):  # mask_wrapped: mask_mod's aux and reference
        aux = build_aux(mode, seqlen, gen, "cpu", chunk=16)  # 16: several chunks, one ragged
        if mode == "mask_mod":
            assert bool((aux[0, 0].bool() == (doc[:, None] == doc[None, :])).all()), "chunked mask != documents"
        q64 = q[0].double().requires_grad_()
        scores = torch.einsum("shd,thd->hst", q64, k[0].double()) * scale + additive_rows(mode, aux, rows)[None]
        dense_out = torch.einsum("hst,thd->shd", scores.softmax(-1), v[0].double())
        dense_out.backward(dout[0].double())
        ref_out, ref_dq = reference_rows(q, k, v, dout, additive_rows(mode, aux, read_rows(rows, seqlen)), rows, scale)
        diff = max(float((ref_out - dense_out.detach()).abs().max()), float((ref_dq - q64.grad).abs().max()))
        as_kernel = [row_error(dense_out.detach()[r].bfloat16(), ref_out[r]) for r in probe_rows(seqlen)]
        dq_kernel = [row_error(q64.grad[r].bfloat16(), ref_dq[r]) for r in probe_rows(seqlen)]
        verdicts.append(diff > 1e-3 if PLANT else diff < 1e-10)
        print(f"  {mode:9} max |row ref - dense| (out, dQ) {diff:.2g}; dense in bf16 judged on rows "
              f"{probe_rows(seqlen)}: out {' '.join(map(fmt, as_kernel))} dq {' '.join(map(fmt, dq_kernel))}")
    print("self-check " + ("PASS" if all(verdicts) else "FAIL"))
    return 0 if all(verdicts) else 1


def main() -> None:
    if sys.argv[1:] == ["--self-check"]:
        sys.exit(self_check(int(os.environ.get("REPRO_SELF_CHECK_S", "70"))))
    unknown = [m for m in MODES if m not in KNOWN_MODES]
    if unknown:
        sys.exit(f"fa4_long_mask_repro: REPRO_MODES has {unknown}; known: {', '.join(KNOWN_MODES)}")
    missing = "; ".join(m for m in (FA4_MISSING, "" if torch.cuda.is_available() else "no CUDA device") if m)
    if missing:
        sys.exit(f"fa4_long_mask_repro: needs a CUDA GPU and flash-attn-4: {missing} (try --self-check)")
    if len(sys.argv) > 1:
        emit(run(*VARIANTS[int(sys.argv[1])]))
        return
    out_dir = Path(os.environ.get("OUT") or "out/h200_fa4_long_mask")
    out_dir.mkdir(parents=True, exist_ok=True)
    versions = {}
    for dist in ("flash-attn-4", "nvidia-cutlass-dsl"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    print(f"FA4 {versions['flash-attn-4']}, torch {torch.__version__}: (1, S, 2, 64) bf16, non-causal; relative error "
          f"of chosen query rows against float64 from the same inputs{' (PLANTED wrong reference)' if PLANT else ''}",
          flush=True)
    rows, start = [], time.time()
    for i, (seqlen, mode) in enumerate(VARIANTS):
        timeout = min(RUN_TIMEOUT_S, BUDGET_S - (time.time() - start) - 10) if BUDGET_S else RUN_TIMEOUT_S
        if timeout < 15:
            row = {"seqlen": seqlen, "mode": mode, "error": "not run: REPRO_BUDGET_S spent"}
        else:
            row, proc = run_variant([*WRAPPER, sys.executable, __file__, str(i)], {"seqlen": seqlen, "mode": mode},
                                    timeout, {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"})
            if WRAPPER and proc is not None:  # the sanitizer's first findings and its summary
                said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("=========")]
                row["sanitizer"] = said[:6] + [ln for ln in said[6:] if "ERROR SUMMARY" in ln]
        rows.append(row)
        print(describe(row), flush=True)
        (out_dir / "fa4-long-mask-repro.json").write_text(json.dumps(
            {"schema_version": 1, "torch": torch.__version__, **versions, "plant": PLANT, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
