"""Correctness depth on one GPU (written for an H200): dropout, determinism, drift, fully masked rows.

Produces reports/h200/depth.md, depth.json and drift-<kernel>.json/.png (copied from $OUT).

    PYTHONPATH=. python3 evidence/h200/depth.py        # ~4-6 min; writes $OUT (or out/h200_depth)

What it does, with the gate's own code (gate/correctness/probes/registry.py, gate/correctness/probes/determinism.py, gate/correctness/probes/dropout.py,
gate/correctness/drift.py) and nothing else:
Order A, C, D, B (FA4 compiles on first use); a time budget (H200_DEPTH_BUDGET_S, default 450 s)
turns whatever is left into SKIP rows that say so.
  A. dropout, SDPA flash: run_case + the dropout checks on bf16/fp16, GQA, causal, seqlen_q !=
     seqlen_k and varlen cases. The mask is read back from the aten op's debug mask
     (return_debug_mask=True) and fed to the float64 reference: out/dq/dk/dv must pass the error
     ratio, the kept fraction the binomial z-test, the same seed reproduce the mask and out,
     another seed change it.
  B. determinism: FA4 with deterministic=True and SDPA mem-efficient (torch.use_deterministic_
     algorithms): 10 runs bit-identical, the race hunt at 4x the batch, batch invariance. SDPA flash
     and cuDNN: the run-to-run spread (information) and batch invariance of what is reproducible.
  C. drift: the toy transformer, 1000 steps, SDPA flash and FA4 against one shared set of
     reference runs (float32, float64, bf16 I/O, reversed keys); JSON + PNG per kernel.
  D. fully masked rows: what SDPA efficient/cuDNN/flash/math really return on rows with no
     allowed key (the adapters declare efficient/cuDNN as NaN there and skip such cases: this
     measures the claim; the skip is lifted only here).
FA4 parts are skipped, with one clear line, when `flash_attn.cute` does not import.
One failing kernel never stops the script: its row says ERROR with the first line of the
exception (full tracebacks in log.txt). Output in $OUT: depth.md (tables), depth.json
(schema_version 1, every row), drift-*.json/png, log.txt; a short table is printed at the end.

H200_DEPTH_DRY=1 rehearses the whole script on the CPU (tiled standing in for every GPU kernel,
tiny shapes, 30 drift steps): plumbing only, it measures nothing about GPUs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

T0 = time.perf_counter()
DRY = os.environ.get("H200_DEPTH_DRY") == "1"
BUDGET_S = float(os.environ.get("H200_DEPTH_BUDGET_S", "450"))  # past this, remaining units are SKIPPED (said so)
OUT = Path(os.environ.get("OUT") or "out/h200_depth")
OUT.mkdir(parents=True, exist_ok=True)
LOG = open(OUT / "log.txt", "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the script

import torch  # noqa: E402

from gate.core.cases import Case  # noqa: E402
from gate.correctness.probes.registry import checks_for  # noqa: E402
from gate.core.config import ToleranceConfig  # noqa: E402
from gate.correctness.run_case import leaf_call, run_case  # noqa: E402
from gate.correctness.probes.determinism import batch_invariance_check, determinism_check, race_check  # noqa: E402
from gate.attention.inputs import make_inputs  # noqa: E402
from gate.kernels.registry import get_adapter  # noqa: E402

DEVICE = "cpu" if DRY else "cuda"
TOL = ToleranceConfig()
ROWS: list[dict] = []


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f}s] {msg}"
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


def row(part: str, kernel: str, case: str, what: str, verdict: str, value: str = "", detail: str = "") -> None:
    ROWS.append(dict(part=part, kernel=kernel, case=case, what=what, verdict=verdict, value=value, detail=detail))
    log(f"{part} {kernel:15} {case:40} {what:18} {verdict:5} {value} {detail[:160]}")


def guarded(part: str, kernel: str, case: str, fn) -> None:
    """Run one unit of work; an exception is an ERROR row, never the end of the script."""
    if time.perf_counter() - T0 > BUDGET_S and kernel != "-":
        row(part, kernel, case, "run", "SKIP", "", f"time budget of {BUDGET_S:.0f}s spent (H200_DEPTH_BUDGET_S)")
        return
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the point is to survive any kernel failure
        text = str(exc).strip().splitlines()
        row(part, kernel, case, "run", "ERROR", "", f"{type(exc).__name__}: {text[0] if text else ''}"[:300])
        LOG.write(traceback.format_exc() + "\n")
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def adapter_for(name: str):
    """The GPU kernel, or in a dry rehearsal tiled under that name (same capabilities as tiled)."""
    return get_adapter("tiled" if DRY else name)


def available(name: str) -> str | None:
    if DRY:
        return None
    try:
        return get_adapter(name).unavailable_reason()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def verdict_of(passed) -> str:
    return {True: "PASS", False: "FAIL", None: "info"}[passed]


def record_case(part: str, kernel: str, result) -> None:
    ratios = " ".join(f"{t.tensor} {t.ratio:.2f}" for t in result.tensors)
    row(part, kernel, result.case_id, "error ratio", result.status.value, ratios, result.reason)
    for c in result.checks:
        row(part, kernel, result.case_id, c.name, verdict_of(c.passed), f"{c.value:.4g}", c.detail)


def C(nq, nk=None, b=2, h="8/2", d=128, dtype="bf16", **kw) -> Case:
    """A case; in a dry rehearsal shrunk to CPU size (same axes)."""
    hq, hkv = (int(x) for x in h.split("/")) if "/" in h else (int(h), int(h))
    nk = nk or nq
    if DRY:
        nq, nk, d, b = max(1, nq // 16), max(1, nk // 16), 32, min(b, 2)
        if kw.get("varlen"):
            kw["varlen"] = tuple(n // 16 for n in kw["varlen"])
    if kw.get("varlen"):
        b, nq, nk = len(kw["varlen"]), max(kw["varlen"]), max(kw["varlen"])
    return Case(batch=b, seqlen_q=nq, seqlen_k=nk, heads_q=hq, heads_kv=hkv, head_dim=d, head_dim_v=d, dtype=dtype, **kw)


# ------------------------------------------------------------------------------------ A. dropout
def part_a() -> None:
    name = "sdpa-flash"
    why = available(name)
    if why:
        row("A", name, "-", "dropout", "SKIP", "", why)
        return
    cases = [
        C(1024, d=64, dropout_p=0.1), C(1024, d=128, dropout_p=0.1, causal=True),
        C(97, 257, d=128, dropout_p=0.2, causal=True), C(257, 97, d=64, dropout_p=0.2, causal=True),
        C(2048, h="16/4", d=128, dtype="fp16", dropout_p=0.3),
        C(0, varlen=(1, 97, 0, 1000, 513), d=128, dropout_p=0.1, causal=True),
    ]
    adapter = adapter_for(name)
    for case in cases:
        case = dataclasses.replace(case, checks=("dropout",))
        guarded("A", name, case.id, lambda case=case: record_case("A", name, run_case(adapter, case, DEVICE, TOL, checks_for(case))))


# -------------------------------------------------------------------------------- B. determinism
def part_b() -> None:
    cases = [C(2048, b=4, h="16/4", causal=False), C(2048, b=4, h="16/4", causal=True),
             C(0, varlen=(1, 97, 0, 1000, 513), h="8/2", causal=True)]
    for name in ("sdpa-efficient", "fa4", "sdpa-flash", "sdpa-cudnn"):
        why = available(name)
        if why:
            line = f"FA4 (flash_attn.cute) is not installed here: FA4 determinism skipped ({why})" if name == "fa4" else why
            row("B", name, "-", "determinism", "SKIP", "", line)
            continue
        adapter = adapter_for(name)
        for case in cases:
            def one(case=case):
                result = run_case(adapter, case, DEVICE, TOL)  # the error ratio of the case itself
                row("B", name, case.id, "error ratio", result.status.value,
                    " ".join(f"{t.tensor} {t.ratio:.2f}" for t in result.tensors), result.reason)
                if result.status.value == "SKIP":
                    return
                for check in (determinism_check(adapter, case, DEVICE), race_check(adapter, case, DEVICE),
                              batch_invariance_check(adapter, case, DEVICE)):
                    for c in check:
                        row("B", name, case.id, c.name, verdict_of(c.passed), f"{c.value:.4g}", c.detail)
            guarded("B", name, case.id, one)


# ---------------------------------------------------------------------------------- C. drift
def part_c() -> None:
    from gate.correctness.drift import default_config, reference_curves, run_drift, write_drift_outputs

    cfg = default_config(DEVICE, steps=30 if DRY else 1000)
    kernels = [k for k in ("sdpa-flash", "fa4")]
    runnable = []
    for name in kernels:
        why = available(name)
        if why:
            line = f"FA4 (flash_attn.cute) is not installed here: FA4 drift skipped ({why})" if name == "fa4" else why
            row("C", name, "-", "drift", "SKIP", "", line)
        else:
            runnable.append(name)
    if not runnable:
        return
    refs: dict = {}

    def train_refs():
        t = time.perf_counter()
        refs.update(reference_curves(cfg, DEVICE, progress=log))
        log(f"reference runs: {time.perf_counter() - t:.1f}s")

    guarded("C", "reference", f"{cfg.steps} steps", train_refs)
    if not refs:
        return
    for name in runnable:
        def one(name=name):
            result = run_drift(name, cfg, DEVICE, adapter=adapter_for(name), progress=log, references=refs)
            paths = write_drift_outputs(result, OUT)
            row("C", name, f"{cfg.steps} steps {cfg.dtype}", "drift", "PASS" if result.passed else "FAIL",
                f"{result.steps_outside} outside", f"{result.reason}; {paths['png'].name}")
        guarded("C", name, f"{cfg.steps} steps", one)


# ----------------------------------------------------------------------- D. fully masked rows
def part_d() -> None:
    cases = [C(1024, 800, h="8", causal=True), C(1024, 800, h="8", causal=True, alibi=True),
             C(1024, 800, h="8", causal=False, window=(16, 0))]
    for name in ("sdpa-efficient", "sdpa-cudnn", "sdpa-flash", "sdpa-math"):
        why = available(name)
        if why:
            row("D", name, "-", "masked rows", "SKIP", "", why)
            continue
        adapter = adapter_for(name)
        caps = adapter.capabilities()
        declared = caps.fully_masked_rows_unsupported or "returns 0"
        lifted = dataclasses.replace(caps, fully_masked_rows_unsupported="")
        adapter.capabilities = lambda lifted=lifted: lifted  # this probe only: measure what is declared
        for case in cases:
            def one(case=case):
                reason = lifted.unsupported_reason(case, DEVICE)
                if reason:
                    row("D", name, case.id, "masked rows", "SKIP", "", reason)
                    return
                inputs = make_inputs(case, 0, DEVICE)
                with torch.no_grad():
                    out = adapter(leaf_call(case, inputs)).out
                empty = case.seqlen_q - case.seqlen_k
                head, rest = out[:, :empty].float(), out[:, empty:].float()
                what = ("NaN" if torch.isnan(head).any() else "0" if bool((head == 0).all()) else
                        f"nonzero (max |out| {float(head.abs().max()):.3g})")
                ok = what == "0" and bool(torch.isfinite(rest).all())
                row("D", name, case.id, "masked rows", "PASS" if ok else "info", what,
                    f"{empty} empty rows give {what}; rest finite: {bool(torch.isfinite(rest).all())}; declared: {declared}")
            guarded("D", name, case.id, one)


# ------------------------------------------------------------------------------------ output
def environment() -> dict:
    env = {"torch": torch.__version__, "device": DEVICE, "dry": DRY}
    if torch.cuda.is_available() and not DRY:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, cuda=str(torch.version.cuda), capability=f"{props.major}.{props.minor}")
    for dist in ("flash-attn-4", "flash-attn"):
        try:
            import importlib.metadata as md

            env[dist] = md.version(dist)
        except Exception:  # noqa: BLE001
            env[dist] = "not installed"
    return env


def write_outputs() -> None:
    from gate.core.jsonio import write_json_atomic, write_text_atomic

    env = environment()
    write_json_atomic(OUT / "depth.json", {"schema_version": 1, "kind": "attn-gate h200 depth", "environment": env,
                                           "wall_s": round(time.perf_counter() - T0, 1), "rows": ROWS})
    titles = {"A": "A. Dropout (SDPA flash, mask from the debug mask)", "B": "B. Determinism and batch invariance",
              "C": "C. Training drift", "D": "D. Fully masked rows (declared vs measured)"}
    lines = ["# attn-gate depth checks on " + env.get("gpu", "the CPU (dry rehearsal)"), "",
             f"torch {env['torch']}, CUDA {env.get('cuda', '-')}, flash-attn-4 {env['flash-attn-4']}; "
             f"wall {time.perf_counter() - T0:.0f}s. Command: `PYTHONPATH=. python3 evidence/h200/depth.py`.", ""]
    for part, title in titles.items():
        rows = [r for r in ROWS if r["part"] == part]
        lines += [f"## {title}", "", "| kernel | case | check | verdict | value | detail |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['kernel']} | `{r['case']}` | {r['what']} | {r['verdict']} | {r['value']} | {r['detail'].replace('|', chr(92) + '|')} |"
                  for r in rows]
        lines.append("")
    pngs = sorted(p.name for p in OUT.glob("drift-*.png"))
    if pngs:
        lines += ["## Drift plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    write_text_atomic(OUT / "depth.md", "\n".join(lines))


def summary() -> None:
    print("\n=== attn-gate depth: summary ===")
    print(f"{'part':4} {'kernel':15} {'check':18} {'pass':>4} {'fail':>4} {'err':>4} {'info':>4} {'skip':>4}")
    keys = []
    for r in ROWS:
        k = (r["part"], r["kernel"], r["what"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        sel = [r["verdict"] for r in ROWS if (r["part"], r["kernel"], r["what"]) == k]
        print(f"{k[0]:4} {k[1]:15} {k[2]:18} {sel.count('PASS'):4} {sel.count('FAIL'):4} {sel.count('ERROR'):4} "
              f"{sel.count('info'):4} {sel.count('SKIP'):4}")
    bad = [r for r in ROWS if r["verdict"] in ("FAIL", "ERROR")]
    for r in bad:
        print(f"  {r['verdict']}: {r['part']} {r['kernel']} {r['case']} {r['what']}: {r['detail'][:200]}")
    print(f"wall {time.perf_counter() - T0:.0f}s; tables in {OUT / 'depth.md'}, rows in {OUT / 'depth.json'}")


def main() -> int:
    log(f"attn-gate depth on {DEVICE}{' (DRY rehearsal)' if DRY else ''}; OUT={OUT}")
    if not DRY and not torch.cuda.is_available():
        print("no CUDA GPU visible: run on the GPU machine (or H200_DEPTH_DRY=1 for a CPU rehearsal)", file=sys.stderr)
        return 2
    if available("fa4"):
        log("FA4 (flash_attn.cute) does not import here: every FA4 part is skipped (install flash-attn-4 to include it)")
    # FA4's first calls compile (CuTe DSL): B goes last so a slow compile cannot starve the rest.
    for part in (part_a, part_c, part_d, part_b):
        guarded(part.__name__[-1].upper(), "-", "-", part)
        write_outputs()
    summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
