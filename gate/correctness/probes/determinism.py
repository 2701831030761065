"""Determinism and batch invariance: bit-identity, measured with torch.equal (never allclose).

Why bit-identity: a kernel that claims a deterministic mode promises that; a reproducible
training run needs it; and a race (a missing barrier, an atomic in the wrong place) shows up first
as a last-bit difference long before it breaks the error ratio. Measured on an H200: SDPA flash
and cuDNN backward are not bit-reproducible (dQ accumulates with atomics), mem-efficient,
FlexAttention and FA4 with deterministic=True are. So:

  * determinism: forward+backward N times on the same inputs. Where the adapter claims a
    deterministic mode (and is called with deterministic=True) every run must equal the first;
    elsewhere the run-to-run max spread per tensor is reported as information (passed=None).
  * race: the same at 4x the batch, where more blocks are in flight at once.
  * batch invariance: keep one sequence, redraw all its neighbours; that sequence's out, LSE and
    grads must not change. A tensor is judged bit-exactly when it is bit-reproducible run to run
    (measured here, twice on the same batch); a tensor that is not (SDPA flash's dQ) cannot be
    judged below its own noise and is reported as information.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from gate.attention.inputs import AttnInputs, make_inputs
from gate.core.cases import Case
from gate.core.results import CheckResult
from gate.correctness.run_case import grad_names, run_kernel
from gate.correctness.tolerance import tensor_spec
from gate.kernels.base import KernelAdapter

DEFAULT_RUNS = 10
RACE_BATCH_FACTOR = 4
NEIGHBOUR_SEED_OFFSET = 7919
INVARIANCE_REPEATS_NO_CLAIM = 3  # the neighbours' values come from another seed of the same case


def run_once(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool):
    """run_kernel (forward + backward, validated), inside the adapter's deterministic scope when
    determinism is asked for: some kernels read a global switch in their backward."""
    scope = adapter.deterministic_scope() if deterministic else contextlib.nullcontext()
    with scope:
        return run_kernel(adapter, case, inputs, deterministic)


def run_tensors(adapter: KernelAdapter, case: Case, inputs: AttnInputs, deterministic: bool) -> dict[str, torch.Tensor]:
    """One forward+backward: out, lse (when exposed), dq, dk, dv, detached."""
    kout, grads = run_once(adapter, case, inputs, deterministic)
    tensors = {"out": kout.out.detach()}
    if kout.lse is not None:
        tensors["lse"] = kout.lse.detach()
    if grads is not None:  # None: a forward-only run has out and lse alone
        # dq, dk, dv; then a trainable bias's gradient (summed across heads/batch, so
        # atomics race too) and the sink gradient where the run produced them
        tensors.update((name, g.detach()) for name, g in zip(grad_names(adapter, case, inputs), grads))
    return tensors


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; inf for a shape mismatch, NaN-safe (NaN vs NaN counts as equal)."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    diff = (a - b).abs().masked_fill(both_nan | same_inf, 0.0)
    return float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, with NaN in the same places counting as equal (an LSE may hold NaN by convention)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return (
        bool(nan_a.any())
        and torch.equal(nan_a, nan_b)
        and torch.equal(a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0))
    )


def scaled_batch(case: Case, factor: int) -> Case:
    """The case with `factor` times as many sequences (varlen: the length list repeated)."""
    shape = dataclasses.replace(case.shape, batch=case.batch * factor)
    if case.entry.varlen is not None:
        keys = None if case.entry.varlen_k is None else case.entry.varlen_k * factor  # keys per sequence too
        entry = dataclasses.replace(case.entry, varlen=case.entry.varlen * factor, varlen_k=keys)
        return dataclasses.replace(case, shape=shape, entry=entry)
    return dataclasses.replace(case, shape=shape)


def determinism_check(
    adapter: KernelAdapter, case: Case, device: str, runs: int = DEFAULT_RUNS, name: str = "determinism"
) -> tuple[CheckResult, ...]:
    if runs < 2:
        raise ValueError("determinism needs at least 2 runs")
    claims = adapter.capabilities().deterministic_mode
    inputs = make_inputs(case, case.seeds[0], device)
    first = run_tensors(adapter, case, inputs, deterministic=claims)
    differing: dict[str, int] = {}
    spread: dict[str, float] = {t: 0.0 for t in first}
    for _ in range(runs - 1):
        again = run_tensors(adapter, case, inputs, deterministic=claims)
        for t, ref in first.items():
            if not _bit_equal(again[t], ref):
                differing[t] = differing.get(t, 0) + 1
                spread[t] = max(spread[t], max_abs_diff(again[t], ref))
        del again
    spreads = ", ".join(f"{t} {spread[t]:.3g}" for t in first)
    worst = max(spread.values())
    if not claims:
        return (
            CheckResult(
                name,
                None,
                worst,
                0.0,
                f"no deterministic mode: run-to-run max spread over {runs} runs: {spreads} (information)",
            ),
        )
    if not differing:
        return (
            CheckResult(
                name, True, 0.0, 0.0, f"{runs} runs in deterministic mode, all bit-identical ({', '.join(first)})"
            ),
        )
    what = ", ".join(f"{t} in {n}/{runs - 1} re-runs (max spread {spread[t]:.3g})" for t, n in differing.items())
    return (
        CheckResult(
            name,
            False,
            float(max(differing.values())),
            0.0,
            f"not bit-identical in deterministic mode over {runs} runs: {what}",
        ),
    )


def race_check(adapter: KernelAdapter, case: Case, device: str, runs: int = DEFAULT_RUNS) -> tuple[CheckResult, ...]:
    big = scaled_batch(case, RACE_BATCH_FACTOR)
    (result,) = determinism_check(adapter, big, device, runs=runs, name="race")
    return (dataclasses.replace(result, detail=f"batch x{RACE_BATCH_FACTOR} ({big.batch} sequences): {result.detail}"),)


def _sequence_slices(case: Case) -> list[slice | int]:
    """How to cut one sequence out of a (B, ...) or packed (total, ...) tensor, per non-empty sequence."""
    if case.entry.varlen is None:
        return list(range(case.batch))
    out, start = [], 0
    for n in case.entry.varlen:
        if n:
            out.append(slice(start, start + n))
        start += n
    return out


def _part(name: str, tensor: torch.Tensor, where: slice | int) -> torch.Tensor:
    """One sequence of a result tensor: batch element `where` (dense), or tokens `where` along the
    spec's token dimension (packed varlen: the LSE is (H, total), the others (total, ...))."""
    if isinstance(where, slice):
        return tensor.narrow(tensor_spec(name).packed_token_dim, where.start, where.stop - where.start)
    return tensor[where]


def _splice(keep_from: AttnInputs, others_from: AttnInputs, where: slice | int) -> AttnInputs:
    """others_from's inputs with sequence `where` (q, k, v and dO) taken from keep_from."""
    fields = {}
    for f in ("q", "k", "v", "dout"):
        t = getattr(others_from, f).clone()
        t[where] = getattr(keep_from, f)[where]
        fields[f] = t
    if keep_from.bias is not None:  # the sequence keeps its own bias (the others still change via q/k/v)
        fields["bias"] = keep_from.bias
    return dataclasses.replace(others_from, seed=keep_from.seed, **fields)


def batch_invariance_check(adapter: KernelAdapter, case: Case, device: str) -> tuple[CheckResult, ...]:
    name = "batch_invariance"
    if case.entry.varlen_k is not None:  # splicing one sequence would need separate key offsets
        return (CheckResult(name, None, 0.0, 0.0, "not applicable: varlen with cu_seqlens_k != cu_seqlens_q"),)
    if case.is_fp8:  # the kernel reads the fp8 tensors and their descales, which _splice leaves as drawn
        return (CheckResult(name, None, 0.0, 0.0, "not applicable: fp8 inputs are not spliced"),)
    if case.entry.varlen is None and case.batch < 2:
        case = dataclasses.replace(case, shape=dataclasses.replace(case.shape, batch=2))
    slices = _sequence_slices(case)
    if len(slices) < 2:
        return (CheckResult(name, None, 0.0, 0.0, "not applicable: fewer than 2 non-empty sequences"),)
    claims = adapter.capabilities().deterministic_mode
    target = slices[0]
    base = make_inputs(case, case.seeds[0], device)
    neighbours = make_inputs(case, case.seeds[0] + NEIGHBOUR_SEED_OFFSET, device)
    changed = _splice(base, neighbours, target)
    first = run_tensors(adapter, case, base, claims)
    if "dbias" in first and first["dbias"].shape[0] == 1:
        del first["dbias"]  # a bias shared by the batch sums every sequence's dS: not one sequence's
    # Run-to-run noise over whole tensors (a race may hit any sequence), more repeats where the
    # kernel promises nothing: a tensor is judged only if every repeat reproduced it bit for bit.
    noisy: dict[str, float] = {t: 0.0 for t in first}
    for _ in range(1 if claims else INVARIANCE_REPEATS_NO_CLAIM):
        again = run_tensors(adapter, case, base, claims)
        for t in first:
            if not _bit_equal(again[t], first[t]):
                noisy[t] = max(noisy[t], max_abs_diff(again[t], first[t]), 2.0**-126)
        del again
    moved = run_tensors(adapter, case, changed, claims)
    judged, unjudged, bad = [], [], []
    worst = 0.0
    for t in first:
        ref = _part(t, first[t], target)
        noise = noisy[t]
        dep = max_abs_diff(_part(t, moved[t], target), ref)
        if noise == 0.0:
            judged.append(t)
            worst = max(worst, dep)
            if not _bit_equal(_part(t, moved[t], target), ref):
                bad.append(f"{t} changed by {dep:.3g}")
        else:
            unjudged.append(f"{t} (run-to-run spread {noise:.3g}, change {dep:.3g})")
    seq = "sequence 0" if case.entry.varlen is None else "the first non-empty sequence"
    info = f"; not judged, not bit-reproducible: {', '.join(unjudged)}" if unjudged else ""
    if not judged:
        return (CheckResult(name, None, 0.0, 0.0, f"nothing bit-reproducible to judge{info}"),)
    if bad:
        return (CheckResult(name, False, worst, 0.0, f"{seq} depends on its neighbours: {', '.join(bad)}{info}"),)
    return (
        CheckResult(name, True, 0.0, 0.0, f"{seq} bit-identical with other neighbours ({', '.join(judged)}){info}"),
    )
