"""Issue #10 on one GPU (written for an H200, < 4 min): the new entry points through the real kernels.

    PYTHONPATH=. python3 evidence/h200/entry.py           # writes $OUT (or out/h200_entry)
    ENTRY_DRY=1 PYTHONPATH=. python3 evidence/h200/entry.py   # CPU rehearsal: tiled / sdpa-math, smoke

Part A, correctness (one `attn-gate sweep` subprocess per kernel and slice, in parallel, each
with its own time limit so one slow kernel never eats the others' time; a slice that runs out
of time is a row that says so, and the slices that finished keep their JSON):
  * the decode / paged-KV / sinks cases of the pr suite (`--only 'kv|sinks'`) for sdpa-flash,
    sdpa-efficient, fa4 (when `flash_attn.cute` imports) and fa2 (when `flash_attn` imports, e.g.
    the Triton-backend wheel from /work/helpers/fa2-triton with FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE,
    which this script sets for the fa2 sweeps);
  * flex on the same cases in three smaller slices (it compiles once per key length);
  * fa2: also the whole pr suite (its flash_attn_func / varlen / dropout calling conventions).
Part B, speed (after A, alone on the GPU): `attn-gate perf` for sdpa-flash on the pr suite's decode
and varlen perf cases (anchor: the config's, sdpa-cudnn), forward-only for decode, with the K/V
GB/s beside the speed ratio.

Output in $OUT: sweep-*.json / validation-*.md per slice, perf-sdpa-flash-pr.json, log-*.txt,
entry.md (the summary table printed at the end) and entry.json (schema_version 1, one row per
slice: kernel, slice, rc, wall_s, pass/fail/error/skip counts, failing case ids with reasons).
Exit 0 always (the rows say what happened); the lead reads entry.md.
ENTRY_PART=A or B runs one part alone (evidence/h200/session.sh runs B in its timing call).
Budget: ENTRY_BUDGET_S (default 220 s) for part A, ENTRY_PERF_S (default 80 s) for part B (cases
the default anchor cannot run are timed again against sdpa-efficient within what is left of it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

DRY = os.environ.get("ENTRY_DRY") == "1"
OUT = Path(os.environ.get("OUT") or "out/h200_entry")
OUT.mkdir(parents=True, exist_ok=True)
BUDGET_A = float(os.environ.get("ENTRY_BUDGET_S", "220"))
BUDGET_B = float(os.environ.get("ENTRY_PERF_S", "80"))
SUITE = "smoke" if DRY else "pr"
ENTRY_LABELS = os.environ.get("ENTRY_LABELS")  # a regex: only the slices whose label matches (evidence/h200/session-x2.sh)
DEVICE = "cpu" if DRY else "cuda"
ENTRY_CASES = r"-kv([\d.]|-|$)|-sinks"  # decode and sinks cases ("kv" alone also matched qkv_packed: seen on the H200)
FLEX_SLICES = {  # flex recompiles per key length: three small slices instead of one long one
    "flex-contiguous": r"-kv[\d.]*(-append)?$",
    "flex-paged": r"-page\d+(-shuffled)?$",
    "flex-window-sinks": r"win|sinks",
}


def importable(module: str, env: dict[str, str]) -> bool:
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, timeout=120)
    return probe.returncode == 0


def slices(env: dict[str, str]) -> list[tuple[str, str, str, dict[str, str]]]:
    """(label, kernel, --only regex or '', env) per sweep to run."""
    if DRY:
        return [("tiled-entry", "tiled", ENTRY_CASES, env), ("sdpa-math-entry", "sdpa-math", ENTRY_CASES, env)]
    out = [("sdpa-flash-entry", "sdpa-flash", ENTRY_CASES, env), ("sdpa-efficient-entry", "sdpa-efficient", ENTRY_CASES, env)]
    out += [(label, "flex", only, env) for label, only in FLEX_SLICES.items()]
    if importable("flash_attn.cute", env):
        out.append(("fa4-entry", "fa4", ENTRY_CASES, env))
    else:
        ROWS.append({"label": "fa4-entry", "kernel": "fa4", "rc": None, "note": "flash_attn.cute does not import: not run"})
    fa2_env = {**env, "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}
    if importable("flash_attn", fa2_env):
        out += [("fa2-entry", "fa2", ENTRY_CASES, fa2_env), ("fa2-pr", "fa2", "", fa2_env)]
    else:
        ROWS.append({"label": "fa2", "kernel": "fa2", "rc": None,
                     "note": "flash_attn does not import (carry the fa2-triton wheel): not run"})
    if ENTRY_LABELS:
        import re

        out = [s for s in out if re.search(ENTRY_LABELS, s[0])]
    return out


ROWS: list[dict] = []


def summarise(label: str, kernel: str, rc: int | None, wall: float, folder: Path, note: str = "") -> dict:
    row = {"label": label, "kernel": kernel, "rc": rc, "wall_s": round(wall, 1), "note": note}
    files = list(folder.glob("sweep-*.json"))
    if files:
        data = json.loads(files[0].read_text())
        row.update(data["summary"])
        row["failing"] = [f"{c['case_id']}: {c['status']} {c['reason'][:160]}" for c in data["cases"]
                          if c["status"] in ("FAIL", "ERROR")]
        row["skipped"] = sorted({c["reason"][:100] for c in data["cases"] if c["status"] == "SKIP"})
    elif not note:
        row["note"] = "no results file (see log)"
    return row


def part_a(env: dict[str, str]) -> None:
    start = time.perf_counter()
    running = []
    for label, kernel, only, kenv in slices(env):
        folder = OUT / label
        folder.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "gate", "sweep", "--kernel", kernel, "--suite", SUITE, "--device", DEVICE,
               "--no-progress", "--out", str(folder)] + ([f"--only={only}"] if only else [])  # = : a regex may start with "-"
        log = open(OUT / f"log-{label}.txt", "w", encoding="utf-8")  # noqa: SIM115 - closed below
        running.append((label, kernel, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=kenv), log, folder))
    for label, kernel, proc, log, folder in running:
        left = max(1.0, BUDGET_A - (time.perf_counter() - start))
        note = ""
        try:
            rc = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            note = f"stopped at the part's {BUDGET_A:.0f} s budget: not finished"
        log.close()
        ROWS.append(summarise(label, kernel, rc, time.perf_counter() - start, folder, note))
        write_outputs()


def part_b(env: dict[str, str], anchor: str | None = None, only: str | None = None, budget: float = BUDGET_B) -> None:
    """The perf run; when the default anchor (sdpa-cudnn) cannot run some cases, they are timed
    once more against sdpa-efficient (a second row, said so)."""
    kernel = "tiled" if DRY else "sdpa-flash"
    only = only or (r"kv|varlen" if not DRY else r"s256")
    label = "perf" if anchor is None else f"perf-{anchor}"
    folder = OUT / label
    folder.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "gate", "perf", "--kernel", kernel, "--suite", SUITE, "--device", DEVICE,
           f"--only={only}", "--out", str(folder)] + (["--rounds", "3"] if DRY else []) + (["--anchor", anchor] if anchor else [])
    t0 = time.perf_counter()
    with open(OUT / f"log-{label}.txt", "w", encoding="utf-8") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=budget).returncode
            note = ""
        except subprocess.TimeoutExpired:
            rc, note = None, f"stopped at the part's {budget:.0f} s budget"
    row = {"label": "perf", "kernel": kernel + (f" vs {anchor}" if anchor else ""), "rc": rc,
           "wall_s": round(time.perf_counter() - t0, 1), "note": note, "perf": []}
    for path in folder.glob("perf-*.json"):
        data = json.loads(path.read_text())
        for c in data["cases"]:
            s = c.get("summary") or {}
            for p in ("fwd", "bwd"):
                if p in s:
                    row["perf"].append({"case": c["case_id"], "pass": p, "speed_ratio": s[p]["speed_ratio"],
                                        "noise": s[p]["noise"], "ms": s[p]["candidate_ms"], "anchor_ms": s[p]["anchor_ms"],
                                        "kv_gbps": s[p].get("candidate_kv_gbps")})
            if c["status"] != "OK":
                row["perf"].append({"case": c["case_id"], "pass": c["status"], "reason": c["reason"][:120]})
    ROWS.append(row)
    write_outputs()
    retry = [p["case"] for p in row["perf"]
             if p.get("reason", "").startswith("anchor") or "SDPA cudnn" in p.get("reason", "")]
    left = BUDGET_B - (time.perf_counter() - T0_B)
    if anchor is None and retry and not DRY and left > 20:
        part_b(env, anchor="sdpa-efficient", only="|".join(re_escape(c) for c in retry), budget=left)


def write_outputs() -> None:
    (OUT / "entry.json").write_text(json.dumps({"schema_version": 1, "dry": DRY, "suite": SUITE, "rows": ROWS}, indent=1))
    lines = [f"# Issue #10 entry points on {'CPU (dry rehearsal)' if DRY else 'the GPU'} — suite {SUITE}", "",
             "| slice | kernel | rc | wall s | PASS | FAIL | ERROR | SKIP | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        if r["label"] == "perf":
            continue
        lines.append(f"| {r['label']} | {r['kernel']} | {r['rc']} | {r.get('wall_s', '-')} | {r.get('PASS', '-')} | "
                     f"{r.get('FAIL', '-')} | {r.get('ERROR', '-')} | {r.get('SKIP', '-')} | {r.get('note', '')} |")
    for r in ROWS:
        for f in r.get("failing", [])[:12]:
            lines.append(f"- {r['label']}: {f}")
        for s in r.get("skipped", [])[:6]:
            lines.append(f"- {r['label']} skip reason: {s}")
    for r in ROWS:
        if r["label"] != "perf":
            continue
        lines += ["", f"## Speed: {r['kernel']} (rc {r['rc']}, {r['wall_s']} s) {r['note']}", "",
                  "| case | pass | speed ratio | noise | ms | anchor ms | K/V GB/s |", "|---|---|---|---|---|---|---|"]
        for p in r["perf"]:
            if "speed_ratio" in p:
                gbps = "-" if p["kv_gbps"] is None else f"{p['kv_gbps']:.0f}"
                lines.append(f"| {p['case']} | {p['pass']} | {p['speed_ratio']:.4f} | {100 * p['noise']:.2f}% | "
                             f"{p['ms']:.4f} | {p['anchor_ms']:.4f} | {gbps} |")
            else:
                lines.append(f"| {p['case']} | {p['pass']} | {p.get('reason', '')} | | | | |")
    (OUT / "entry.md").write_text("\n".join(lines) + "\n")


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


T0_B = time.perf_counter()


def main() -> int:
    global T0_B
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH", ""), "."])),
           "PYTHONUNBUFFERED": "1"}
    if DEVICE == "cuda":
        with open(OUT / "nvidia-smi.txt", "w") as fh:
            subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,temperature.gpu", "--format=csv"],
                           stdout=fh, stderr=subprocess.STDOUT, check=False)
    parts = os.environ.get("ENTRY_PART", "AB")  # A, B or AB: run the parts apart (B times: the GPU alone)
    if "A" in parts:
        part_a(env)
    if "B" in parts:
        T0_B = time.perf_counter()
        part_b(env)
    print((OUT / "entry.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
