"""How often the speed rule FAILs an unchanged kernel (A/A) and a planted slower pass, on this machine.

    .venv/bin/python scripts/speed_rule_benchmark.py [--kernel sdpa-cpu] [--suite smoke] [--case REGEX]
                                                     [--trials 10] [--slowdown-pct 200] [--pass bwd]
                                                     [--planted delay|repeat] [--json FILE]

A benchmark of the rule, not a unit test: it times real kernels, so its numbers depend on the
machine and on what else runs there (that is the point: a noisy shared CPU). One speed baseline is
measured as `baseline update --perf` does (max(confirm_rounds, rounds) rounds), then `--trials`
times each: the unchanged kernel (A/A) and the kernel with the chosen pass slowed by
`--slowdown-pct` (200: 3x slower) by gate/speed/planted.py: on a GPU its `torch.cuda._sleep` delay,
on a CPU its repeated work (`--planted repeat`: the kernel run 3 times, so the extra work is slowed
by the machine's load as the kernel is; `--planted delay`, a fixed busy-wait, shrinks against it).
Every trial is judged by `judge_perf` with the config's rule, confirm re-runs included, exactly as
`attn-gate check --perf` judges. Prints per trial the change with its interval and the verdict,
then the FAIL counts. Exit 0 when A/A has no FAIL and every slowed trial FAILs, else 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

from gate.core.config import load_config
from gate.core.environment import default_device, host_id
from gate.kernels.registry import kernel_entry
from gate.speed.planted import CPU_CYCLES_PER_MS, RepeatedKernel, SlowedKernel, planted_cycles
from gate.speed.runs import PerfResult, baseline_entry, case_anchor, judge_perf, measure_case
from gate.speed.timing import PASSES, TimingPlan, sleep_cycles_per_ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="sdpa-cpu")
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--case", default=None, help="regex of the perf case (default: the suite's cheapest)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--slowdown-pct", type=float, default=200.0, help="planted slowdown of the pass, percent (200: 3x)")
    ap.add_argument("--pass", dest="pass_", choices=PASSES, default="bwd")
    ap.add_argument(
        "--planted",
        choices=("delay", "repeat"),
        default=None,
        help="delay: a busy-wait / torch.cuda._sleep of slowdown-pct of the pass's baseline time "
        "(default on a GPU); repeat: the kernel's work run 1 + slowdown-pct/100 times, a whole "
        "number (default on a CPU, where a fixed delay shrinks against the load)",
    )
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write every trial here")
    args = ap.parse_args(argv)

    config = load_config(args.config)
    cfg = config.perf
    device = args.device or default_device()
    adapter = kernel_entry(args.kernel, config).adapter()
    cases = [c for c in config.suite(args.suite).perf_cases if args.case is None or re.search(args.case, c.id)]
    if not cases:
        print(f"no perf case of {args.suite!r} matches {args.case!r}", file=sys.stderr)
        return 2
    case = min(cases, key=lambda c: c.flops("fwd") + c.flops("bwd"))
    anchor = case_anchor(cfg.anchor_for(device), cfg, case, device)
    print(
        f"{args.kernel} vs {anchor} on {case.id} ({device}); rule: {(1 - cfg.alpha) * 100:g}% interval, limit "
        f"{cfg.regression_pct_for(device):g}%, rounds {cfg.rounds}, confirm {cfg.confirm_rounds}",
        flush=True,
    )

    t0 = time.perf_counter()
    base = measure_case(
        adapter, anchor, case, device, TimingPlan.from_config(cfg, rounds=max(cfg.confirm_rounds, cfg.rounds))
    )
    if not base.measured:
        print(f"baseline not measured: {base.label} {base.reason}", file=sys.stderr)
        return 2
    host = host_id(device)  # baseline and trials are timed here: the same host's limit applies
    baseline_perf = {case.id: baseline_entry(base, anchor, host)}
    for p in PASSES:
        est = base.estimate(p)
        if est is not None:
            print(
                f"baseline {p}: ratio {est.median:.4f}, noise band {cfg.noise_k * est.noise * 100:.1f}% "
                f"({cfg.noise_k:g} x the median's standard error; spread IQR/median "
                f"{base.pass_timing(p).spread * 100:.1f}%)",
                flush=True,
            )

    pass_ms = base.pass_timing(args.pass_).candidate_median_ms
    cycles_per_ms = sleep_cycles_per_ms(samples=5) if device == "cuda" else CPU_CYCLES_PER_MS
    planted = args.planted or ("delay" if device == "cuda" else "repeat")
    if planted == "repeat":
        times = 1 + args.slowdown_pct / 100
        if times != int(times):
            print(
                f"--planted repeat needs a whole number of repeats: --slowdown-pct {args.slowdown_pct:g} gives {times:g}",
                file=sys.stderr,
            )
            return 2
        slowed = RepeatedKernel(adapter, int(times))
    else:
        cycles = planted_cycles(args.slowdown_pct, pass_ms, cycles_per_ms)
        slowed = SlowedKernel(adapter, **{f"{args.pass_}_cycles": cycles})
    print(f"planted: {slowed.description}", flush=True)
    trials = []
    for name, kernel, level in (
        ("A/A", adapter, 0.0),
        (f"{args.pass_} +{args.slowdown_pct:g}%", slowed, args.slowdown_pct),
    ):
        for i in range(args.trials):
            plan = TimingPlan.from_config(cfg, passes=(args.pass_,))
            t1 = time.perf_counter()
            pc = measure_case(kernel, anchor, case, device, plan)
            result = PerfResult(
                kernel=args.kernel,
                anchor=anchor,
                suite=args.suite,
                device=device,
                environment={"host": host},
                plan=plan,
                cases=(pc,),
                started_at="",
                wall_s=0.0,
            )

            def remeasure(c, pass_, rounds, kernel=kernel):
                again = measure_case(
                    kernel, anchor, c, device, TimingPlan.from_config(cfg, rounds=rounds, passes=(pass_,))
                )
                return again.estimate(pass_) if again.measured else None

            # the baseline times both passes; the trial times one, so only its judgement counts
            (j,) = [x for x in judge_perf(result, baseline_perf, cfg, remeasure) if x.pass_ == args.pass_]
            trials.append(
                {
                    "experiment": name,
                    "level_pct": level,
                    "planted": planted if level else "",
                    "trial": i,
                    "severity": j.severity.value,
                    "change": j.change,
                    "ci": [j.ci_low, j.ci_high],
                    "confirmed": j.confirmed,
                    "remeasured": j.first_change == j.first_change,  # NaN unless a re-run decided
                    "wall_s": round(time.perf_counter() - t1, 2),
                    "message": j.message,
                }
            )
            print(f"{name:>10} #{i + 1:<2} {j.severity.value:12} {j.message}", flush=True)

    counts = {
        name: Counter(t["severity"] for t in trials if t["experiment"] == name)
        for name in dict.fromkeys(t["experiment"] for t in trials)
    }
    print(f"\n{case.id} {args.pass_}, {args.trials} trials each, {time.perf_counter() - t0:.0f}s:")
    for name, c in counts.items():
        print(
            f"  {name:>10}: FAIL {c['FAIL']} of {args.trials}  (OK {c['OK']}, INCONCLUSIVE {c['INCONCLUSIVE']}, "
            f"WARN {c['WARN']})"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "case": case.id,
                    "kernel": args.kernel,
                    "anchor": anchor,
                    "device": device,
                    "pass": args.pass_,
                    "slowdown_pct": args.slowdown_pct,
                    "trials": trials,
                },
                indent=1,
            )
            + "\n"
        )
    aa, slow = counts.values()
    return 0 if aa["FAIL"] == 0 and slow["FAIL"] == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
