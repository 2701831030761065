"""What asv on every PR costs on the GPU runner: the time gate.yml's asv step adds to a PR run.

Produces reports/h200/pr-asv.md and pr-asv.json (copied from $OUT).

    python3 evidence/h200/pr_asv.py        # a few minutes on an H200; writes $OUT (or out/h200_pr_asv)

Needs what the GPU job has: attn-gate pip-installed (asv drops PYTHONPATH, so `pip install -e .`
or the repository's .venv), asv, git, a CUDA torch. It works in a clone of this repository's
committed history under $OUT (nothing in the working tree is touched) and runs, each part timed
and bounded by H200_PR_ASV_BUDGET_S (default 900 s):
  A. `attn-gate bench` on HEAD^, as publish.yml does on main: the stored history (not PR cost);
  B. gate.yml's asv step itself (its `run:` text, read from .github/workflows/gate.yml), on HEAD,
     with A's results as the checked-out branch asv-results: `attn-gate bench` on the head plus
     `asv compare` against the newest ancestor with results. This is the time a PR run gains;
  C. `asv compare` alone (the part of B that is not benchmarking).
Each part's wall time, exit code and the tail of its output go to pr-asv.json as soon as it
ends (schema_version 1); pr-asv.md has the table and B's comparison as the PR comment shows it.
A short table is printed at the end. Earlier measurement for scale: asv bench of the suites of
the time took 68 s on an H200.

H200_PR_ASV_DRY=1 rehearses it on the CPU (device cpu, one smoke perf case, 3 rounds): plumbing
only, it measures nothing about GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DRY = os.environ.get("H200_PR_ASV_DRY") == "1"
BUDGET_S = float(os.environ.get("H200_PR_ASV_BUDGET_S", "900"))
OUT = Path(os.environ.get("OUT") or "out/h200_pr_asv").resolve()
DEVICE = "cpu" if DRY else "cuda"


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def asv_step_script() -> str:
    job = yaml.safe_load((ROOT / ".github" / "workflows" / "gate.yml").read_text())["jobs"]["gate"]
    return next(s for s in job["steps"] if s.get("id") == "asv")["run"]


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    work, temp, home = OUT / "checkout", OUT / "runner-temp", OUT / "home"
    for path in (work, temp, home):
        shutil.rmtree(path, ignore_errors=True)
    temp.mkdir()
    home.mkdir()
    (temp / "gate-summary").mkdir()
    (temp / "gate-results").mkdir()
    git("clone", "-q", str(ROOT), str(work), cwd=OUT)
    if (ROOT / ".venv" / "bin" / "activate").exists():
        (work / ".venv").symlink_to(ROOT / ".venv")
    else:  # the step sources .venv/bin/activate; here the calling environment is the venv
        (work / ".venv" / "bin").mkdir(parents=True)
        (work / ".venv" / "bin" / "activate").write_text("# evidence/h200/pr_asv.py: the caller's environment\n")
    if subprocess.run(["git", "rev-parse", "-q", "--verify", "refs/heads/main"], cwd=work, capture_output=True).returncode:
        git("branch", "main", "HEAD", cwd=work)  # asv resolves the configured branch locally
    head, base = git("rev-parse", "HEAD", cwd=work), git("rev-parse", "HEAD^", cwd=work)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_GATE_", "GITHUB_", "RUNNER_"))}
    env.update({"HOME": str(home), "ATTN_GATE_DEVICE": DEVICE, "PYTHONNOUSERSITE": "1", "RUNNER_TEMP": str(temp),
                "GITHUB_STEP_SUMMARY": str(temp / "step-summary.md")})
    if DRY:
        env.update({"ATTN_GATE_ONLY": "^bf16-b2-h4-s256-d64$", "ATTN_GATE_ROUNDS": "3"})
    report = {"schema_version": 1, "dry": DRY, "device": DEVICE, "head": head, "base": base, "budget_s": BUDGET_S,
              "parts": []}

    def part(name: str, cmd: list[str]) -> dict:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BUDGET_S)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, output = "timeout", f"over the budget of {BUDGET_S:.0f} s: {exc}"
        row = {"part": name, "wall_s": round(time.perf_counter() - t0, 1), "exit": rc, "tail": output[-3000:]}
        report["parts"].append(row)
        (OUT / "pr-asv.json").write_text(json.dumps(report, indent=1))
        print(f"{name}: {row['wall_s']} s, exit {rc}", flush=True)
        return row

    attn_gate = shutil.which("attn-gate", path=str(ROOT / ".venv" / "bin") + os.pathsep + env.get("PATH", ""))
    if attn_gate is None:
        print("attn-gate is not installed: pip install -e . (asv needs the project installed)")
        return 2
    part("A. bench HEAD^ (publish.yml's history; not PR cost)",
         [attn_gate, "bench", "--asv-config", "asv.conf.json", "--device", DEVICE, "--commit", base])
    results = work / ".asv" / "results"
    if results.is_dir():
        (work / ".asv-history").mkdir()
        results.rename(work / ".asv-history" / "results")
    shutil.rmtree(work / ".asv", ignore_errors=True)
    step = part("B. gate.yml's asv step on HEAD (bench + compare): the PR's added time",
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", asv_step_script()])
    machine = "cpu" if DRY else subprocess.run(
        [sys.executable, "-c", "from gate.speed.asv import machine_name; print(machine_name('cuda'))"],
        cwd=work, env=env, capture_output=True, text=True).stdout.strip()
    part("C. asv compare alone", [sys.executable, "-m", "asv", "compare", "--config", "asv.conf.json", "--machine",
                                  machine or "h200", base, head])

    note = temp / "gate-summary" / "asv-compare.md"
    lines = ["# asv on every PR: the time it adds (gate.yml's asv step)", "",
             f"{'DRY RUN on the CPU: plumbing only, no GPU numbers.' if DRY else 'Measured on the GPU runner.'} "
             f"Head {head[:12]}, base {base[:12]}, device {DEVICE}.", "",
             "| part | wall s | exit |", "|---|---:|---|"]
    lines += [f"| {p['part']} | {p['wall_s']} | {p['exit']} |" for p in report["parts"]]
    lines += ["", "B is what every PR run gains; A is what publish.yml already spends on main.", "",
              "## The comparison as the PR comment shows it", "",
              note.read_text() if note.exists() else f"(no asv-compare.md; step exit {step['exit']})"]
    (OUT / "pr-asv.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:4 + 2 + len(report["parts"])]))
    return 0 if all(p["exit"] == 0 for p in report["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
