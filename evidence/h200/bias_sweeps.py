"""Custom bias and mask sweeps on one GPU (issue #16; written for an H200).

Produces reports/h200/bias.md and bias.json (copied from $OUT), plus one bias-<kernel>.jsonl per
kernel (a row per case, appended as it finishes, so a killed run keeps what it measured).

    PYTHONPATH=. python3 evidence/h200/bias_sweeps.py          # ~5 min; writes $OUT (or out/h200_bias)

What it runs, with the gate's own code (gate.correctness.run_case on the pr suite's bias cases,
every kind: dense, broadcast_b/h/1, shifted_rows, bool_mask, bool_empty_rows, document,
prefix_lm, with and without the bias gradient, fp32 biases with bf16/fp16 inputs):
  sdpa-efficient, sdpa-cudnn, sdpa-math  attn_mask (float and bool); cuDNN's backward returns no
                                         attn_bias gradient, so its bias_grad rows are SKIPPED
  flex                                   score_mod capturing the bias (with backward), mask_mod for
                                         the boolean patterns
  fa4                                    only where `flash_attn.cute` imports: CuTe score_mod /
                                         mask_mod over aux_tensors (gate/kernels/fa4_mods.py); its
                                         bias_grad rows are SKIPPED (no aux-tensor gradient)
  flex-flash                             FlexAttention with kernel_options BACKEND=FLASH (the FA4
                                         CuTe kernels driven by Flex's mods), where that exists;
                                         an experiment: its rows are evidence, not a gate verdict
Kernels run as parallel processes (Flex compiles are CPU-bound), each with its own time budget
(BIAS_BUDGET_S, default 210 s per kernel; the whole script stays near 5 minutes). Cases are
ordered so every bias kind comes early; cases left when the budget runs out are written as SKIP
rows that say so. A kernel that crashes leaves ERROR rows with the first line of the exception.

Each FAIL/ERROR row carries a reproduction command (`attn-gate sweep --kernel K --suite pr --only
'^ID$'`), to trace a failure to a kernel bug before anything is claimed about it.

BIAS_KERNELS=flex,sdpa-math runs a subset; BIAS_SWEEPS_DRY=1 rehearses the plumbing on the CPU (tiled and sdpa-math on the smoke suite's
bias cases, 60 s budget): it measures nothing about GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

DRY = os.environ.get("BIAS_SWEEPS_DRY") == "1"
OUT = Path(os.environ.get("OUT") or "out/h200_bias")
BUDGET_S = float(os.environ.get("BIAS_BUDGET_S", "60" if DRY else "210"))
KERNELS = tuple(os.environ["BIAS_KERNELS"].split(",")) if os.environ.get("BIAS_KERNELS") else (
    ("tiled", "sdpa-math") if DRY else ("sdpa-efficient", "sdpa-cudnn", "sdpa-math", "flex", "fa4", "flex-flash"))
SUITE = "smoke" if DRY else "pr"
DEVICE = "cpu" if DRY else "cuda"


def _cases():
    """The suite's bias cases, interleaved by kind so a budget cut still covers every kind."""
    from gate.core.cases import load_suite

    by_kind: dict[str, list] = {}
    for c in load_suite(SUITE).cases:
        if c.has_bias:
            by_kind.setdefault(c.bias, []).append(c)
    order = []
    while any(by_kind.values()):
        for kind in list(by_kind):
            if by_kind[kind]:
                order.append(by_kind[kind].pop(0))
    return order


def _adapter(name: str):
    from gate.kernels.registry import get_adapter

    if name != "flex-flash":
        return get_adapter(name)
    from gate.kernels.flex import FlexAdapter

    class FlexFlash(FlexAdapter):
        """Flex with the FA4 (CuTe) backend: the same mods, compiled into flash_attn.cute kernels."""

        name = "flex-flash"

        def unavailable_reason(self):
            try:
                import flash_attn.cute  # noqa: F401
            except Exception as exc:  # noqa: BLE001 - any import failure means: not here
                return f"flash_attn.cute does not import ({type(exc).__name__})"
            return super().unavailable_reason()

        def _fn(self):
            compiled = super()._fn()
            return lambda *a, **kw: compiled(*a, **kw, kernel_options={"BACKEND": "FLASH"})

    return FlexFlash()


def run_one(kernel: str) -> None:
    """One kernel's rows, appended to bias-<kernel>.jsonl as each case finishes."""
    import torch

    from gate.core.config import ToleranceConfig
    from gate.correctness.run_case import run_case

    path = OUT / f"bias-{kernel}.jsonl"
    t0 = time.perf_counter()
    cases = _cases()
    with path.open("w", encoding="utf-8") as fh:
        def row(c, status, reason, tensors=None, seconds=0.0):
            data = {"kernel": kernel, "case_id": c.id, "bias": c.bias, "bias_dtype": c.bias_dtype, "bias_grad": c.bias_grad,
                    "status": status, "reason": reason, "ratios": tensors or {}, "seconds": round(seconds, 2)}
            if status in ("FAIL", "ERROR"):
                data["repro"] = f"PYTHONPATH=. python3 -m gate sweep --kernel {kernel} --suite {SUITE} --only '^{c.id}$'"
            fh.write(json.dumps(data) + "\n")
            fh.flush()

        try:
            adapter = _adapter(kernel)
            why = adapter.unavailable_reason()
        except Exception as exc:  # noqa: BLE001
            adapter, why = None, f"{type(exc).__name__}: {exc}"
        for c in cases:
            if why:
                row(c, "SKIP", f"kernel unavailable: {why}")
                continue
            if time.perf_counter() - t0 > BUDGET_S:
                row(c, "SKIP", f"time budget ({BUDGET_S:.0f} s) spent before this case")
                continue
            try:
                r = run_case(adapter, c, DEVICE, ToleranceConfig())
                row(c, r.status.value, r.reason, {t.tensor: round(t.ratio, 4) for t in r.tensors}, r.seconds)
            except Exception as exc:  # noqa: BLE001 - run_case already turns kernel crashes into rows
                row(c, "ERROR", f"harness: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                traceback.print_exc()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


def _environment() -> dict:
    try:
        import torch

        from gate.core.environment import describe

        return describe(DEVICE, "bias sweeps", torch.__version__)
    except Exception as exc:  # noqa: BLE001 - the environment is information, never a reason to stop
        return {"error": f"{type(exc).__name__}: {exc}"}


def summarise() -> str:
    rows = []
    for k in KERNELS:
        path = OUT / f"bias-{k}.jsonl"
        if path.exists():
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    per_kernel: dict[str, dict[str, int]] = {}
    for r in rows:
        counts = per_kernel.setdefault(r["kernel"], {})
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [f"# Custom bias sweeps ({SUITE} suite, bias cases) on {DEVICE}" + (" (DRY: CPU rehearsal)" if DRY else ""), "",
             "| kernel | PASS | FAIL | ERROR | SKIP | worst ratio (case) |", "|---|---|---|---|---|---|"]
    for k in KERNELS:
        mine = [r for r in rows if r["kernel"] == k]
        measured = [r for r in mine if r["ratios"]]
        worst = max(measured, key=lambda r: max(r["ratios"].values()), default=None)
        cell = f"{max(worst['ratios'].values()):.2f} (`{worst['case_id']}`)" if worst else "-"
        c = per_kernel.get(k, {})
        lines.append(f"| {k} | {c.get('PASS', 0)} | {c.get('FAIL', 0)} | {c.get('ERROR', 0)} | {c.get('SKIP', 0)} | {cell} |")
    lines += ["", "## Per bias kind (PASS/measured, worst ratio)", "", "| kernel | kind | PASS / measured | worst |", "|---|---|---|---|"]
    for k in KERNELS:
        for kind in sorted({r["bias"] for r in rows if r["kernel"] == k}):
            mine = [r for r in rows if r["kernel"] == k and r["bias"] == kind and r["status"] != "SKIP"]
            if not mine:
                continue
            worst = max((max(r["ratios"].values()) for r in mine if r["ratios"]), default=float("nan"))
            lines.append(f"| {k} | {kind} | {sum(r['status'] == 'PASS' for r in mine)} / {len(mine)} | {worst:.2f} |")
    bad = [r for r in rows if r["status"] in ("FAIL", "ERROR")]
    lines += ["", f"## FAIL / ERROR rows ({len(bad)})", ""]
    lines += [f"- {r['kernel']} `{r['case_id']}` {r['status']}: {r['reason'][:300]}\n  repro: `{r['repro']}`" for r in bad] or ["none"]
    skips: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["status"] == "SKIP":
            skips[(r["kernel"], r["reason"][:160])] = skips.get((r["kernel"], r["reason"][:160]), 0) + 1
    lines += ["", "## SKIP reasons", ""] + [f"- {k}: {n} x {why}" for (k, why), n in sorted(skips.items())]
    text = "\n".join(lines) + "\n"
    (OUT / "bias.md").write_text(text, encoding="utf-8")
    (OUT / "bias.json").write_text(json.dumps({"schema_version": 1, "suite": SUITE, "device": DEVICE, "dry": DRY,
                                               "budget_s_per_kernel": BUDGET_S, "environment": _environment(),
                                               "rows": rows}, indent=1, sort_keys=True), encoding="utf-8")
    return text


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        run_one(sys.argv[2])
        return 0
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.environ.get("PYTHONPATH", ".") + os.pathsep + ".")
    if DRY:
        env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    procs = {}
    for k in KERNELS:
        log = (OUT / f"log-{k}.txt").open("w", encoding="utf-8")
        procs[k] = (subprocess.Popen([sys.executable, __file__, "--one", k], stdout=log, stderr=subprocess.STDOUT, env=env), log)
    for k, (proc, log) in procs.items():
        try:  # the budget bounds the cases started; a case in flight gets 90 s more before the kill
            proc.wait(timeout=max(1.0, BUDGET_S + 90 - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            with (OUT / f"bias-{k}.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"kernel": k, "case_id": "(killed)", "bias": "-", "bias_dtype": None, "bias_grad": False,
                                     "status": "ERROR", "reason": "killed: a case overran the budget by 90 s",
                                     "ratios": {}, "repro": f"see log-{k}.txt"}) + "\n")
        log.close()
        print(f"{k}: rc={proc.returncode} at {time.perf_counter() - t0:.0f} s", flush=True)
    print(summarise())
    return 0


if __name__ == "__main__":
    sys.exit(main())
