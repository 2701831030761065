"""One tiled-hosted planted bug on the cases a GPU selftest judges it on, measured on this CPU.

The selftest judges a tiled-hosted bug only on the cases of tiled's limited control: the first
batch (FIRST_BATCH, cheapest first) of every tiled-hosted bug's exercising cases, as selected for
the GPU run (`--device` below). This script rebuilds that case list for `--kernel`/`--suite` and
runs the planted variant of `BUG` on each with run_case on the CPU, printing status and worst
ratio per case, in the selftest's order (its first batch, then the rest).

    python evidence/planted_on_cases.py causal_peek            # the H200 selftest's cases (sdpa-flash, pr)

Written to check, after the fix that made planted tiled variants keep the custom bias, that
`causal_peek` still dies on the H200 run's 15 cases by tolerance (the H200 kill was the dropped
bias). Plumbing on the CPU: the same tile algorithm as `tiled` on a GPU, not a GPU measurement.
"""

from __future__ import annotations

import sys
import time


def main(bug_name: str, kernel: str = "sdpa-flash", suite: str = "pr", gpu: str = "cuda") -> int:
    from gate.core.cases import load_suite
    from gate.core.config import load_config
    from gate.correctness.planted import BUGS, host_of, planted_adapter, select_bugs
    from gate.correctness.run_case import run_case
    from gate.kernels.registry import get_adapter
    from gate.workflow.selftest import FIRST_BATCH, exercising_cases

    cfg = load_config("pyproject.toml")
    cases = load_suite(suite, cfg.suites, cfg.source).cases
    tiled, under_test = get_adapter("tiled"), get_adapter(kernel)
    scope = {c.id for b in select_bugs(()) if not b.trigger.pending and host_of(b, under_test) == "tiled"
             for c in exercising_cases(b, cases, tiled, gpu)[:FIRST_BATCH]}
    bug = next(b for b in BUGS if b.name == bug_name)
    chosen = [c for c in exercising_cases(bug, cases, tiled, gpu) if c.id in scope]
    planted = planted_adapter(bug, tiled)
    print(f"{bug_name}: {len(chosen)} cases (first batch: {FIRST_BATCH})")
    for i, case in enumerate(chosen):
        t0 = time.perf_counter()
        row = run_case(planted, case, "cpu", cfg.tolerance, ())
        print(f"{'batch 1' if i < FIRST_BATCH else 'batch 2'}  {row.status.value:5} ratio {row.worst_ratio:10.3g}  "
              f"{case.id}  {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
