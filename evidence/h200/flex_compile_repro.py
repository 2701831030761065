"""Standalone probe of FlexAttention's compile ERRORs in the H200 sweeps, in plain PyTorch with no
attn-gate code: does `torch.compile(flex_attention, dynamic=False)`, forward and backward, fail on the
gate's flex adapter's (gate/kernels/flex.py) failing shapes for any caller? Each shape runs with its
mask_mod in plain Python integers and reading offset (and window sides) from captured device tensors as
the adapter does: both failing puts the ERROR in FlexAttention; only the captured one, in the adapter.

REPRO_SET=causal (the default) RAN on 2026-12-01e (reports/h200/session-2026-12-01e, call15/, 83 s, one
process): causal GQA off the 128 grid (97, 127, 16x4096) failed alike either way (Inductor
`NoValidChoicesError` "No choices exist for backend"), d256 over shared memory ("No valid triton
configs"), the s128 control compiled. (2026-12-01d: 12 of 15 flex pr ERRORs failed again alone.)

REPRO_SET=window RAN on 2026-12-01g (reports/h200/session-2026-12-01g, call1/, 368 s, one process per
shape): all 11 rows came out as the rule says, plain and captured alike. The 5 predicted to fail ended in
`NoValidChoicesError`, among them s17-win64.0 at 8/1 (BLOCK_M 256); the 6 it calls ok compiled: s17 at 8/2
(BLOCK_M 128), MHA 8/8 at s97, s97 with no mask, s513x13 (q >= 128, the main kernel), the on-grid s128, and
s97-win128.0 with FORCE_USE_FLEX_ATTENTION. So the failing varlen/window rows are FlexAttention's.
The 2026-12-01f nightly had 111 flex `NoValidChoicesError`s
in varlen GQA batches (8/2 heads, d128, bf16/fp16) with a causal or window mask (causal, (128, 0),
(64, 64), causal + (64, 64)), softcap/ALiBi or not, the pr suite 23; the batches without a mask pass, as
do fixed-length GQA windows at long lengths (1000x3000, 1023x1024). The adapter runs a varlen batch as
one flex call per non-empty sequence (gate/kernels/base.py `per_sequence`: batch 1, a slice of the packed
(total, heads, d) buffer transposed to (1, heads, n, d)); this set compiles single sequences of those
batches laid out and called that way (scale, LSE), the captured variant reading offset, left and right
from three separate 0-d tensors, as the adapter does since aedcafa (at 1dd6246, which ran the sweeps,
equal values shared one tensor). REPRO_SET=all runs every set.

Each row carries what `rule_of` predicts, read in torch 2.13's torch/_inductor/kernel/flex/
flex_decoding.py (pytorch PR #185349 describes it at Q_LEN=100, 2 query heads per KV head): a query
under 128 rows with a power-of-two GQA group goes to the flex-decoding kernel, whose M tile packs the
group, BLOCK_M = next_power_of_2(q_len * group) (>= 16); every config is dropped when the block mask's
128-row Q block is not a multiple of it: q_len * group > 128 (no mask: one 2**30-row block; MHA packs
nothing). It fits the 2026-12-01e run and, offline (evidence/h200/flex_decode_rule_check.py over the
committed sweeps), the 2,057 flex case results of pr (2026-12-01c) and nightly (2026-12-01d/e/f, re-runs g/h), a
later re-run winning: it predicts all 276 `NoValidChoicesError` rows, and of the cases it predicts only
3 did not end so: 3 SKIPs (never ran; the `__closure__` crash of 2026-12-01f re-ran on 2026-12-01h into the
predicted error). Each failing varlen
batch holds a sequence with q_len * group > 128 (97 or 127 long at 8/2, or 17 at 8/1: 136); the 8/2
4224.1.17 batches pass (17 * 4 = 68). The 276 rows are about a dozen distinct (length, group) pairs,
most of them q = 97, 113 or 127 at group 4, so the count says less than its size: this set is the test.

REPRO_SET=smem (RAN on 2026-12-01h: reports/h200/session-2026-12-01h, call1/ for five shapes in 342 s,
call3/ for the s97 d128 one with REPRO_ONLY, 508 s) tests flex_decode_rule_check.py's second rule in plain flex: unmasked
GQA shapes under 128 query rows go to flex-decoding too, whose packed Q tile (BLOCK_M x the head dim rounded
up to a power of two x 2 bytes) must fit in the H200's 232,448 bytes of shared memory per block: 3 shapes of
pr and nightly over the line, 2 controls under it, and the s97 16/1 d128 row whose sweep case hit the 300 s
case timeout twice (2026-12-01e and g) while siblings of the same BLOCK_M 2048 ended in "No valid triton
configs" (bf16 d96 in 9 s on 2026-12-01g); REPRO_SHAPE_TIMEOUT_S=360 gives it more than the sweep did.
All 6 came out as the rule says: the 4 over the line fail with "No valid triton configs. OutOfMemoryError",
Triton's "Required" equal to the Q tile plus one 64-row V tile (270,336 / 278,528 / 294,912 / 540,672 bytes),
the 2 controls compile; the s97 d128 shape took 496 s to reach that error (call 1's REPRO_BUDGET_S=520 cut
it after ~180 s; call 3 ran it alone under REPRO_SHAPE_TIMEOUT_S=560). So one of the sweep's 5 case-timeout
shapes is this failure, slow; the other four (d192/128, d256, fp16 d96, d256) are that by the rule only.

    REPRO_SET=window python3 evidence/h200/flex_compile_repro.py   # 11 shapes, 21 compiles: 368 s on 2026-12-01g
    REPRO_SET=smem REPRO_SHAPE_TIMEOUT_S=560 python3 evidence/h200/flex_compile_repro.py   # 6 shapes, ~900 s
    REPRO_SET=window python3 evidence/h200/flex_compile_repro.py --check-masks   # CPU rehearsal of the masks
    REPRO_SET=smem REPRO_ONLY=s97-d128 REPRO_SHAPE_TIMEOUT_S=560 python3 evidence/h200/flex_compile_repro.py  # 508 s

Each shape runs in a process group of its own under REPRO_SHAPE_TIMEOUT_S (150; 0: all in this process,
as 2026-12-01e ran); each row is printed, and the JSON ($OUT, else out/h200_flex_compile) rewritten, as it
ends, with a timed-out shape's finished variant: a cut run keeps them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

from flex_decode_rule_check import SHARED_MEMORY_BYTES, decode_block_m, decode_q_tile_bytes  # torch-free sibling: the rules

REPRO_SET = os.environ.get("REPRO_SET", "causal")
SHAPE_TIMEOUT_S = float(os.environ.get("REPRO_SHAPE_TIMEOUT_S", "150"))

# (label, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, dtype): rows of the 2026-12-01d recheck
CAUSAL = [
    ("bf16-b2-h16/4-s97-d64-causal", 2, 16, 4, 97, 97, 64, True, torch.bfloat16),
    ("fp16-b2-h16/4-s97-d128-causal", 2, 16, 4, 97, 97, 128, True, torch.float16),
    ("fp16-b2-h8/4-s127-d104-causal", 2, 8, 4, 127, 127, 104, True, torch.float16),
    ("fp16-b2-h8/2-s127-d59-causal", 2, 8, 2, 127, 127, 59, True, torch.float16),
    ("bf16-b4-h32/1-s16x4096-d128-causal", 4, 32, 1, 16, 4096, 128, True, torch.bfloat16),
    ("bf16-b2-h8/2-s113x203-d256", 2, 8, 2, 113, 203, 256, False, torch.bfloat16),
    ("bf16-b2-h16/4-s128-d64-causal (control)", 2, 16, 4, 128, 128, 64, True, torch.bfloat16),
]

# (label, heads_q, heads_kv, seqlen_q, seqlen_k, (left, right) or None for no mask, FORCE_USE_FLEX_ATTENTION):
# one sequence of a failing varlen batch, bf16 d128 batch 1; causal is right = 0 (causal + (64, 64) = (64, 0)).
# Ordered so a cut run keeps the decisive rows: a failing sequence, then what should separate it from passing.
WINDOW = [
    ("s97-win128.0", 8, 2, 97, 97, (128, 0), False),          # of 1.97.0.1000.513 (and x300.97..): 97*4 > 128
    ("s97-win128.0 MHA 8/8 (control)", 8, 8, 97, 97, (128, 0), False),  # same mask, no group: should compile
    ("s97 no mask (control)", 8, 2, 97, 97, None, False),      # no block mask: the varlen rows without one pass
    ("s17-win64.0", 8, 2, 17, 17, (64, 0), False),             # of 4224.1.17 (8/2 rows passed): 17*4 = 68
    ("s17-win64.0 h8/1", 8, 1, 17, 17, (64, 0), False),        # the pr row's 8/1: 17*8 = 136 > 128
    ("s513x13-win128.0", 8, 2, 513, 13, (128, 0), False),      # of x1.200.0.999.13: off-grid, but q >= 128
    ("s97-win128.0 FORCE_USE_FLEX_ATTENTION", 8, 2, 97, 97, (128, 0), True),  # the adapter's way out?
    ("s128-win128.0 (control)", 8, 2, 128, 128, (128, 0), False),  # on the grid
    ("s127-win64.0", 8, 2, 127, 127, (64, 0), False),          # of 127.129.256, causal + (64, 64)
    ("s97-win64.64", 8, 2, 97, 97, (64, 64), False),           # a two-sided window
    ("s97x200-win128.0", 8, 2, 97, 200, (128, 0), False),      # of 1.97.0.1000.513 x 1.200.0.999.13: q < k
]
# The shared-memory rule (flex_decode_rule_check.py's second): unmasked GQA calls under 128 query rows, laid out
# like the causal set's rows (causal False). Failing shapes of flex's pr and nightly sweeps with controls either
# side of the 232,448-byte line; the slow one last (its sweep case hit the 300 s case timeout twice).
SMEM = [
    ("bf16-b2-h16/1-s97-d64", 2, 16, 1, 97, 97, 64, False, torch.bfloat16),            # 2048 x 64 x 2 = 256 KiB
    ("bf16-b2-h8/1-s127-d64 (control)", 2, 8, 1, 127, 127, 64, False, torch.bfloat16),  # 1024 x 64 x 2 = 128 KiB
    ("bf16-b2-h8/1-s127-d72", 2, 8, 1, 127, 127, 72, False, torch.bfloat16),            # 1024 x 128 x 2 = 256 KiB
    ("bf16-b2-h8/2-s127-d128 (control)", 2, 8, 2, 127, 127, 128, False, torch.bfloat16),  # 512 x 128 x 2 = 128 KiB
    ("bf16-b2-h8/2-s127-d160", 2, 8, 2, 127, 127, 160, False, torch.bfloat16),          # 512 x 256 x 2 = 256 KiB
    ("bf16-b2-h16/1-s97-d128", 2, 16, 1, 97, 97, 128, False, torch.bfloat16),           # 2048 x 128 x 2 = 512 KiB
]
SETS = {"causal": CAUSAL, "window": WINDOW, "smem": SMEM}
REPRO_ONLY = os.environ.get("REPRO_ONLY", "")  # run only the set's shapes whose name contains this
ROWS = [("window" if name == "window" else "causal", r) for name, rows in SETS.items()
        if REPRO_SET in (name, "all") for r in rows if REPRO_ONLY in r[0]]


def rule_of(kind: str, spec) -> str:
    """What torch's flex-decoding lowering should do with this shape: flex_decode_rule_check.py's two rules
    (a masked call's BLOCK_M against the 128-row Q block; an unmasked call's packed Q tile against shared memory)."""
    if kind == "causal":  # label, b, hq, hkv, nq, nk, d, causal, dtype
        (hq, hkv, nq), masked, force = spec[2:5], spec[7], False
    else:  # label, hq, hkv, nq, nk, window, force
        (hq, hkv, nq), masked, force = spec[1:4], spec[5] is not None, spec[6]
    if not masked and not force:  # the shared-memory rule (an unmasked call takes decoding too); the window set is bf16 d128
        head_dim, element_bytes = (spec[6], spec[8].itemsize) if kind == "causal" else (128, 2)
        tile = decode_q_tile_bytes(nq, hq // hkv, head_dim, element_bytes)
        if tile is not None:
            verdict = "fails" if tile > SHARED_MEMORY_BYTES else "ok"
            return f"{verdict}: decode Q tile {tile} B {'>' if verdict == 'fails' else '<='} {SHARED_MEMORY_BYTES}"
    block_m = None if force or not masked else decode_block_m(nq, hq // hkv)
    if block_m is None:
        return "ok: main kernel, or no mask"
    return f"fails: decode BLOCK_M {block_m} > 128" if block_m > 128 else f"ok: decode BLOCK_M {block_m}"


def window_mods(nq: int, nk: int, left: int, right: int, device: str):
    """(plain, captured): the adapter's bottom-right mask_mod (gate/kernels/flex.py `_make_mods`), a side < 0 absent;
    plain reads Python integers, captured three separate 0-d device tensors (offset, left, right) like `_on`."""
    def make(offset, lo, hi):
        def mask_mod(b, h, q_idx, kv_idx):
            diag = q_idx + offset
            ok = kv_idx >= 0
            if right >= 0:
                ok = ok & (kv_idx <= diag + hi)
            if left >= 0:
                ok = ok & (kv_idx >= diag - lo)
            return ok
        return mask_mod

    return make(nk - nq, left, right), make(*(torch.tensor(x, device=device) for x in (nk - nq, left, right)))


def attempt(fn, tensors, mask_mod, nq, nk, sequence: bool = False, force: bool = False) -> str:
    """Forward and backward; 'ok' or the error's first line. Not `sequence`: the causal set's call as run on
    2026-12-01e ((b, h, n, d) tensors). `sequence`: one varlen sequence as the adapter calls flex on it, from
    packed (1 + n, heads, d) buffers (a 1-long sequence first) sliced, batched and transposed (per_sequence,
    then `_dense`), with its scale and LSE (and kernel_options FORCE_USE_FLEX_ATTENTION where `force`)."""
    try:
        block_mask = create_block_mask(mask_mod, None, None, nq, nk, device="cuda") if mask_mod else None
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        q, k, v = (t[1:][None].transpose(1, 2) for t in leaves) if sequence else leaves
        kw = dict(block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
        if not sequence:
            out = fn(q, k, v, **kw)
        else:
            kw.update(scale=q.shape[-1] ** -0.5, kernel_options={"FORCE_USE_FLEX_ATTENTION": True} if force else None)
            try:
                from torch.nn.attention.flex_attention import AuxRequest

                out, _ = fn(q, k, v, **kw, return_aux=AuxRequest(lse=True))
            except ImportError:
                out, _ = fn(q, k, v, **kw, return_lse=True)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # the point is which error, if any
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


@functools.cache
def compiled():
    """One compiled flex_attention per process; dynamo's recompile limits raised as the adapter does (else an
    in-process run falls back to eager after 8 entries and reports a shape 'ok' that never compiled)."""
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 512))
    return torch.compile(flex_attention, dynamic=False)


def row_head(kind: str, spec) -> dict:
    """What names a row, the same whether its child finished or not."""
    if kind == "causal":
        return {"set": kind, "case": spec[0], "rule": rule_of(kind, spec)}
    label, hq, hkv, window = spec[0], spec[1], spec[2], spec[5]
    return {"set": kind, "case": f"bf16-b1-h{hq}/{hkv}-d128 {label}", "window": window, "rule": rule_of(kind, spec)}


def run_row(kind: str, spec, report=lambda key, value: None) -> dict:
    """Both variants of one shape; `report` hears each as it ends (a child prints it, for a timed-out parent)."""
    start, fn = time.time(), compiled()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if kind == "causal":
        label, b, hq, hkv, nq, nk, d, causal, dtype = spec
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=dtype, generator=gen)
        tensors = [q] + [torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2)]
        offset = torch.tensor(nk - nq, device="cuda")
        plain = captured = None
        if causal:
            def plain(bi, h, qi, ki, _o=nk - nq):  # bottom-right causal, the offset a Python int
                return ki <= qi + _o

            def captured(bi, h, qi, ki):  # the same, the offset read from a captured device tensor
                return ki <= qi + offset
        sequence, force = False, False
    else:
        label, hq, hkv, nq, nk, window, force = spec
        tensors = [torch.randn(1 + n, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for n, h in ((nq, hq), (nk, hkv), (nk, hkv))]
        plain, captured = window_mods(nq, nk, *window, "cuda") if window else (None, None)
        sequence = True
    row = row_head(kind, spec)
    for key, mod in (("plain mask_mod", plain), ("captured-tensor mask_mod", captured)):
        row[key] = attempt(fn, tensors, mod, nq, nk, sequence, force) if mod or key == "plain mask_mod" else "(no mask)"
        report(key, row[key])
    row["seconds"] = round(time.time() - start, 1)
    return row


def check_masks() -> None:
    """CPU rehearsal of the window set's mask_mods: plain and captured evaluated densely must agree with each
    other and with the bottom-right definition; their block masks must match and cover the dense mask."""
    for label, hq, hkv, nq, nk, window, _ in WINDOW:
        if window is None:
            continue
        left, right = window
        plain, captured = window_mods(nq, nk, left, right, "cpu")
        dense = [create_mask(m, 1, 1, nq, nk, device="cpu")[0, 0] for m in (plain, captured)]
        diag, ki = torch.arange(nq)[:, None] + nk - nq, torch.arange(nk)[None, :]  # the definition, a side < 0 absent:
        ref = ((ki <= diag + right) | (right < 0)) & ((ki >= diag - left) | (left < 0))  # keys in [diag - left, diag + right]
        blocks = [create_block_mask(m, None, None, nq, nk, device="cpu") for m in (plain, captured)]
        same_blocks = all(torch.equal(getattr(blocks[0], a), getattr(blocks[1], a))
                          for a in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"))
        listed = blocks[0].to_dense()[0, 0].repeat_interleave(128, 0).repeat_interleave(128, 1)[:nq, :nk].bool()
        print(f"{label:40} allowed {int(ref.sum()):6} of {nq * nk:6} | plain vs captured differ: "
              f"{int((dense[0] != dense[1]).sum())} | plain vs definition: {int((dense[0] != ref).sum())} | "
              f"block masks equal: {same_blocks} | allowed outside listed blocks: {int((ref & ~listed).sum())}")


CHILD: list = []  # the running child, for `stop`


def stop(signum, frame):
    """A parent told to stop (timeout(1) signals its own process group, not the child's) takes the child along."""
    for proc in CHILD:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    sys.exit(128 + signum)


def run_child(i: int, kind: str, spec) -> dict:
    """Row i in a process group of its own under SHAPE_TIMEOUT_S; output to files, so no compile worker holds a
    pipe open. A variant the child did not finish reads as its exit or the timeout, with stderr's last lines."""
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc = subprocess.Popen([sys.executable, __file__, "--row", str(i)], stdout=out_f, stderr=err_f,
                                start_new_session=True)
        CHILD[:] = [proc]
        try:
            missing = f"exit {proc.wait(timeout=SHAPE_TIMEOUT_S)}: "
        except subprocess.TimeoutExpired:
            missing = f"timed out after {SHAPE_TIMEOUT_S:g} s (REPRO_SHAPE_TIMEOUT_S) "
        with contextlib.suppress(ProcessLookupError):  # its compile workers too
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        CHILD.clear()
        out_f.seek(0), err_f.seek(0)
        out, err = (f.read().decode(errors="replace") for f in (out_f, err_f))
    lines = out.splitlines()
    found = [json.loads(ln[4:]) for ln in lines if ln.startswith("ROW ")]
    if found:
        return found[0]
    missing = (missing + " | ".join(err.strip().splitlines()[-3:])[:300]).strip()
    return {**row_head(kind, spec), "plain mask_mod": missing, "captured-tensor mask_mod": missing,
            **dict(json.loads(ln[5:]) for ln in lines if ln.startswith("PART "))}


def describe(r: dict) -> str:
    return (f"{r['case']:48.48} rule: {r['rule'][:40]:40} | plain: {r['plain mask_mod'][:60]:60} | "
            f"captured: {r['captured-tensor mask_mod'][:60]} ({r.get('seconds', '-')} s)")


def main() -> None:
    if "--check-masks" in sys.argv:
        return check_masks()
    if len(sys.argv) > 2 and sys.argv[1] == "--row":  # a child: one shape, each variant and then its row on stdout
        row = run_row(*ROWS[int(sys.argv[2])], report=lambda key, value: print("PART " + json.dumps([key, value]), flush=True))
        print("ROW " + json.dumps(row), flush=True)
        return
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    out_dir = Path(os.environ.get("OUT") or "out/h200_flex_compile")
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"REPRO_SET={REPRO_SET}: {len(ROWS)} shapes, torch {torch.__version__}", flush=True)
    rows = []
    for i, (kind, spec) in enumerate(ROWS):
        row = run_row(kind, spec) if SHAPE_TIMEOUT_S <= 0 else run_child(i, kind, spec)
        rows.append(row)
        print(describe(row), flush=True)
        (out_dir / "flex-compile-repro.json").write_text(json.dumps(
            {"schema_version": 2, "torch": torch.__version__, "set": REPRO_SET, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
