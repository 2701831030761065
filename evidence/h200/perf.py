"""Measure the speed gate itself on one GPU (written for an H200): false alarms and detection.

Produces reports/h200/perf-sensitivity.md and perf-sensitivity.json (copied from $OUT).

    PYTHONPATH=. python3 evidence/h200/perf.py            # ~6-7 min; writes $OUT (or out/h200_perf)

What it does, in one process, with the gate's own engine and rule (gate/speed/timing.py,
gate/speed/rule.py, defaults of [tool.attn-gate.perf]):
  1. per shape (bf16 b4 h16 s4096 d128, causal and non-causal): a baseline of the speed ratio
     sdpa-flash / sdpa-cudnn with confirm_rounds rounds (as `baseline update` would);
  2. the agreement of the engine's per-call CUDA-event times with torch.profiler's kernel times;
  3. trials, interleaved in time so drift hits all alike:
       A/A   an unchanged kernel checked against the baseline (false alarms),
       planted slowdowns of 2, 3, 5, 10 % in the forward only or the backward only: a wrapper
       adds torch.cuda._sleep(cycles) calibrated to that pass's own measured time (backward: in an
       autograd.Function's backward); each trial's MEASURED shift is recorded;
     each trial is one check (config rounds x calls); a suspected regression is re-measured with
     confirm_rounds, exactly as `attn-gate check` does.
The trial count (20) is kept for every experiment that runs: after the first trial round the
script drops the lowest-priority experiments that would not fit the time budget (and says so).
Results are written after every trial round (JSON + Markdown), so a timeout still leaves data.

Env knobs: H200_PERF_BUDGET_S (default 400 s of trials+setup), H200_PERF_TRIALS (20),
H200_PERF_DRY=1 (a CPU rehearsal of the whole script on tiny shapes: busy-wait instead of _sleep,
no profiler; checks the plumbing, measures nothing about GPUs).
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("H200_PERF_BUDGET_S", "400"))
LEVELS_ENV = os.environ.get("H200_PERF_LEVELS", "")
TRIALS = int(os.environ.get("H200_PERF_TRIALS", "20"))
# H200_PERF_LEVELS=5,10 runs only those planted levels (A/A always runs): a second run for the
# levels a first run's budget dropped.
LEVELS = (3, 2, 5, 10)  # percent, in priority order
LEVELS_RUN = tuple(int(x) for x in LEVELS_ENV.split(",") if x.strip()) or LEVELS
TABLE_PCTS = (1.5, 2.0, 2.5, 3.0)  # regression_pct values the rule is re-evaluated at (offline)
CANDIDATE, ANCHOR, FALLBACK_ANCHOR = "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"
TRIAL_WARMUP_S = 0.05  # the GPU is already hot between back-to-back trials
OUT = Path(os.environ.get("OUT") or "out/h200_perf")
DRY = os.environ.get("H200_PERF_DRY") == "1"
DEVICE = "cpu" if DRY else "cuda"
INVOCATION = "PYTHONPATH=. python3 evidence/h200/perf.py"


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def main() -> int:
    import torch

    from gate.core.cases import Case
    from gate.core.config import PerfConfig
    from gate.core.environment import describe
    from gate.attention.inputs import make_inputs
    from gate.kernels.registry import get_adapter
    from gate.speed.rule import PerfRules, judge
    from gate.speed.planted import CPU_CYCLES_PER_MS, SlowedKernel, planted_cycles
    from gate.speed.timing import KernelWorkload, TimingPlan, make_clock, read_gpu_state, sleep_cycles_per_ms, time_pair

    global CANDIDATE, ANCHOR, FALLBACK_ANCHOR
    if DRY:
        CANDIDATE, ANCHOR, FALLBACK_ANCHOR = "sdpa-cpu", "sdpa-math", "tiled"
    elif not torch.cuda.is_available():
        print("no CUDA GPU: this script measures the gate on a GPU", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = PerfConfig()
    rules = PerfRules.from_config(cfg)
    probe_rules = dataclasses.replace(rules, regression_pct=min(TABLE_PCTS))  # confirm when suspected at the lowest
    report: dict = {
        "schema_version": 1, "kind": "attn-gate perf sensitivity", "invocation": INVOCATION,
        "environment": describe(DEVICE, CANDIDATE, torch.__version__), "dry_run": DRY, "python": platform.python_version(),
        "perf_config": dataclasses.asdict(cfg), "trial_warmup_s": TRIAL_WARMUP_S, "budget_s": BUDGET_S,
        "trials_per_experiment": TRIALS, "shapes": {}, "experiments": {}, "dropped": [], "errors": [],
        "gpu_state_start": read_gpu_state().to_dict(),
    }
    cycles_per_ms = CPU_CYCLES_PER_MS if DRY else sleep_cycles_per_ms(samples=5)
    report["sleep_cycles_per_ms"] = cycles_per_ms
    log(f"GPU {report['environment'].get('gpu_name')}, torch {torch.__version__}, _sleep {cycles_per_ms:.0f} cycles/ms")

    check_plan = TimingPlan(rounds=cfg.rounds, calls_per_round=cfg.calls_per_round, warmup_s=TRIAL_WARMUP_S, cold_l2=cfg.cold_l2)
    flash = get_adapter(CANDIDATE)
    shapes = {}
    for causal in (True, False):
        n, b, h = (128, 1, 2) if DRY else (4096, 4, 16)
        case = Case(batch=b, seqlen_q=n, seqlen_k=n, heads_q=h, heads_kv=h, head_dim=128 if not DRY else 32,
                    head_dim_v=128 if not DRY else 32, dtype="bf16" if not DRY else "fp32", causal=causal, perf=True)
        key = "causal" if causal else "noncausal"
        try:
            inputs = make_inputs(case, 0, DEVICE)
            anchor_name = ANCHOR
            anchor = KernelWorkload(get_adapter(ANCHOR), case, DEVICE, inputs)
            try:
                anchor.prepare()
                anchor.run("bwd")  # the anchor must do both passes on this shape
            except Exception as exc:
                report["errors"].append(f"{key}: anchor {ANCHOR} failed ({exc}); using {FALLBACK_ANCHOR}")
                anchor_name = FALLBACK_ANCHOR
                anchor = KernelWorkload(get_adapter(FALLBACK_ANCHOR), case, DEVICE, inputs)
            cand = KernelWorkload(flash, case, DEVICE, inputs)
            clock = make_clock(DEVICE, check_plan)
            base_plan = dataclasses.replace(check_plan, rounds=cfg.confirm_rounds, warmup_s=1.0)
            run = time_pair(cand, anchor, base_plan, DEVICE, clock=clock)
            base = {p.pass_: p.estimate() for p in run.passes}
            pass_ms = {p.pass_: p.candidate_median_ms for p in run.passes}
            shapes[key] = dict(case=case, inputs=inputs, anchor=anchor, cand=cand, clock=clock, base=base, pass_ms=pass_ms)
            report["shapes"][key] = {
                "case_id": case.id, "anchor": anchor_name, "baseline_rounds": cfg.confirm_rounds,
                "baseline": {p: base[p].to_dict() for p in base}, "candidate_ms": pass_ms,
                "anchor_ms": {p.pass_: p.anchor_median_ms for p in run.passes},
                "tflops": {p.pass_: case.flops(p.pass_) / (p.candidate_median_ms * 1e-3) / 1e12 for p in run.passes},
                "baseline_wall_s": run.wall_s, "shield_ms": run.shield_ms, "l2_flush_mb": run.l2_flush_mb,
                "peak_mem_mb": run.peak_mem_mb, "gpu_end": run.gpu_end.to_dict(),
            }
            log(f"{key}: baseline fwd {base['fwd'].median:.4f} (noise {base['fwd'].noise * 100:.2f}%), "
                f"bwd {base['bwd'].median:.4f} (noise {base['bwd'].noise * 100:.2f}%); flash fwd {pass_ms['fwd']:.3f} ms "
                f"bwd {pass_ms['bwd']:.3f} ms; shield {run.shield_ms:.3f} ms; {run.wall_s:.1f}s")
        except Exception as exc:
            report["errors"].append(f"{key}: baseline failed: {type(exc).__name__}: {exc}")
            log(f"{key}: baseline FAILED: {exc}\n{traceback.format_exc()}")
    if not shapes:
        write(report)
        return 1

    for key, s in shapes.items():
        if DRY:
            continue
        try:
            report["shapes"][key]["profiler"] = profiler_agreement(s, torch)
            log(f"{key}: profiler agreement {report['shapes'][key]['profiler']['summary']}")
        except Exception as exc:
            report["errors"].append(f"{key}: profiler comparison failed: {type(exc).__name__}: {exc}")
            log(f"{key}: profiler comparison failed: {exc}")
    write(report)

    # Experiments in priority order: A/A on both shapes, then 3%, 2%, then 5/10% (causal first: cheaper).
    experiments = [(k, "aa", None, 0) for k in shapes]
    for level in LEVELS_RUN:
        for k in shapes:
            for p in ("fwd", "bwd"):
                experiments.append((k, "planted", p, level))
    workloads = {}
    for k, kind, p, level in experiments:
        name = exp_name(k, kind, p, level)
        s = shapes[k]
        if kind == "aa":
            workloads[name] = s["cand"]
        else:
            cycles = planted_cycles(level, s["pass_ms"][p], cycles_per_ms)  # the selftest's delay, sized as it does
            planted = SlowedKernel(flash, fwd_cycles=cycles if p == "fwd" else 0, bwd_cycles=cycles if p == "bwd" else 0)
            workloads[name] = KernelWorkload(planted, s["case"], DEVICE, s["inputs"])
            report["experiments"].setdefault(name, {})["sleep_cycles"] = cycles
        report["experiments"].setdefault(name, {}).update(shape=k, kind=kind, pass_=p, nominal_pct=level, trials=[])

    active = [exp_name(*e) for e in experiments]
    cost: dict[str, float] = {}
    for trial in range(TRIALS):
        t_round = time.perf_counter()
        for k, kind, p, level in experiments:
            name = exp_name(k, kind, p, level)
            if name not in active:
                continue
            s = shapes[k]
            passes = ("fwd", "bwd") if kind == "aa" else (p,)
            t1 = time.perf_counter()
            try:
                rec = one_check(workloads[name], s, passes, check_plan, cfg, rules, probe_rules, judge, time_pair)
            except Exception as exc:
                rec = {"error": f"{type(exc).__name__}: {exc}"}
                report["errors"].append(f"{name} trial {trial}: {rec['error']}")
            rec["wall_s"] = time.perf_counter() - t1
            report["experiments"][name]["trials"].append(rec)
            cost[name] = max(cost.get(name, 0.0), rec["wall_s"])
        if trial == 0:
            active = fit_budget(active, cost, TRIALS - 1, report)
        summarise(report, rules)
        write(report)
        log(f"trial round {trial + 1}/{TRIALS} done in {time.perf_counter() - t_round:.1f}s; "
            + "; ".join(f"{n}: {report['summary'][n]['headline']}" for n in active if n in report.get("summary", {}))[:600])
    report["gpu_state_end"] = read_gpu_state().to_dict()
    report["wall_s"] = time.perf_counter() - T0
    summarise(report, rules)
    write(report)
    print_table(report)
    return 0


def exp_name(shape: str, kind: str, pass_: str | None, level: int) -> str:
    return f"{shape}/aa" if kind == "aa" else f"{shape}/{pass_}+{level}%"


def one_check(workload, s, passes, plan, cfg, rules, probe_rules, judge, time_pair) -> dict:
    """One gate check of `workload` against the shape's anchor and baseline, per pass, with the
    confirm re-run when the lowest tabled threshold suspects a regression."""
    import dataclasses as dc

    run = time_pair(workload, s["anchor"], dc.replace(plan, passes=passes), DEVICE, clock=s["clock"])
    rec = {"throttled": run.throttled, "sm_clock_end": run.gpu_end.sm_clock_mhz, "passes": {}}
    for pt in run.passes:
        est = pt.estimate()
        base = s["base"][pt.pass_]
        entry = {"first": est.to_dict(), "shift": est.median / base.median - 1.0}
        probe = judge("x", pt.pass_, base, est, probe_rules)
        if probe.suspected and cfg.confirm_rounds > 0:
            again = time_pair(workload, s["anchor"], dc.replace(plan, passes=(pt.pass_,), rounds=cfg.confirm_rounds),
                              DEVICE, clock=s["clock"])
            entry["confirm"] = again.passes[0].estimate().to_dict()
            rec["throttled"] = rec["throttled"] or again.throttled
        confirm = _estimate_or_none(entry.get("confirm"))
        verdict = judge("x", pt.pass_, base, est, rules, confirm=confirm)
        entry["verdict"] = verdict.severity.value
        entry["message"] = verdict.message
        entry["verdict_without_confirm"] = judge("x", pt.pass_, base, est, rules).severity.value
        entry["verdict_by_regression_pct"] = {  # the same rule at other thresholds (confirm run when any suspects)
            f"{pct:g}": judge("x", pt.pass_, base, est, dc.replace(rules, regression_pct=pct), confirm=confirm).severity.value
            for pct in TABLE_PCTS}
        rec["passes"][pt.pass_] = entry
    return rec


def _estimate_or_none(d):
    from gate.speed.rule import RatioEstimate

    return None if d is None else RatioEstimate.from_dict(d)


def fit_budget(active: list[str], cost: dict[str, float], remaining_trials: int, report: dict) -> list[str]:
    """Keep the longest priority prefix of experiments whose remaining trials fit the budget."""
    left = BUDGET_S - (time.perf_counter() - T0)
    kept, total = [], 0.0
    for i, name in enumerate(active):
        need = cost.get(name, 0.0) * remaining_trials * 1.1
        if total + need > left:  # strict priority: this one and everything after it
            report["dropped"] += [f"{n} (~{cost.get(n, 0.0) * remaining_trials * 1.1:.0f}s more needed)" for n in active[i:]]
            report["dropped_budget_left_s"] = left - total
            break
        kept.append(name)
        total += need
    if report["dropped"]:
        log("time budget: dropped " + ", ".join(report["dropped"]))
    return kept


def profiler_agreement(s, torch) -> dict:
    """Engine event time per call vs torch.profiler's GPU activity in that call (same loop).

    The engine's own time_calls runs under the profiler (flush, launch shield, events); GPU
    activities are split into calls at the shield's spin kernels; the flush kernel that ends each
    segment (before the next spin) is dropped. Span = first kernel start to last kernel end."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    clock = s["clock"]
    for label, w in (("candidate", s["cand"]), ("anchor", s["anchor"])):
        for p in ("fwd", "bwd"):
            n = 8
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                times = clock.time_calls(lambda w=w, p=p: w.run(p), n)
            acts = []
            for e in prof.profiler.kineto_results.events():
                if e.device_type() != torch.autograd.DeviceType.CUDA or e.is_user_annotation():
                    continue
                acts.append((e.start_ns(), e.duration_ns(), e.name()))
            acts.sort()
            spins = [i for i, a in enumerate(acts) if "spin" in a[2].lower()]
            segments = []
            for j, i in enumerate(spins):
                end = spins[j + 1] - 1 if j + 1 < len(spins) else len(acts)  # drop the next call's flush
                seg = acts[i + 1:end]
                if seg:
                    segments.append(seg)
            sums = [sum(a[1] for a in seg) / 1e6 for seg in segments]
            spans = [(max(a[0] + a[1] for a in seg) - seg[0][0]) / 1e6 for seg in segments]
            if len(segments) != n:
                out[f"{label}/{p}"] = {"error": f"found {len(segments)} call segments for {n} calls (spin kernels: {len(spins)})",
                                       "event_ms": list(times)}
                continue
            med = lambda xs: sorted(xs)[len(xs) // 2]
            out[f"{label}/{p}"] = {
                "event_ms": med(times), "kernel_sum_ms": med(sums), "kernel_span_ms": med(spans),
                "event_vs_span_pct": (med(times) / med(spans) - 1) * 100, "event_vs_sum_pct": (med(times) / med(sums) - 1) * 100,
                "kernels_per_call": len(segments[0]), "kernel_names": sorted({a[2][:80] for a in segments[0]}),
            }
    ok = [v for v in out.values() if "error" not in v]
    out["summary"] = (f"event vs profiler span: {min(v['event_vs_span_pct'] for v in ok):+.2f}% .. "
                      f"{max(v['event_vs_span_pct'] for v in ok):+.2f}%" if ok else "no comparable segments")
    return out


def summarise(report: dict, rules) -> None:
    summary = {}
    for name, exp in report["experiments"].items():
        trials = [t for t in exp["trials"] if "passes" in t]
        if not trials:
            continue
        passes = ("fwd", "bwd") if exp["kind"] == "aa" else (exp["pass_"],)
        row = {"trials": len(trials), "errors": len(exp["trials"]) - len(trials),
               "throttled": sum(1 for t in trials if t.get("throttled")), "wall_s_median": med([t["wall_s"] for t in trials])}
        for p in passes:
            entries = [t["passes"][p] for t in trials]
            shifts = sorted(e["shift"] for e in entries)
            fails = sum(1 for e in entries if e["verdict"] == "FAIL")
            inconclusive = sum(1 for e in entries if e["verdict"] == "INCONCLUSIVE")
            first_only = sum(1 for e in entries if e["verdict_without_confirm"] == "FAIL")
            table = {f"{pct:g}": sum(1 for e in entries if e["verdict_by_regression_pct"][f"{pct:g}"] == "FAIL")
                     for pct in TABLE_PCTS}
            row[p] = {"fail": fails, "inconclusive": inconclusive, "fail_without_confirm": first_only,
                      "measured_shift_median_pct": med(shifts) * 100, "measured_shift_min_pct": shifts[0] * 100,
                      "measured_shift_max_pct": shifts[-1] * 100,
                      "noise_median_pct": med([e["first"]["noise"] for e in entries]) * 100,
                      "fail_by_regression_pct": table}
        if exp["kind"] == "aa":
            total_fail = sum(row[p]["fail"] for p in passes)
            row["headline"] = f"A/A false alarms {total_fail}/{len(trials)} checks (fwd {row['fwd']['fail']}, bwd {row['bwd']['fail']})"
        else:
            p = exp["pass_"]
            row["headline"] = (f"caught {row[p]['fail']}/{len(trials)}, measured shift median "
                               f"{row[p]['measured_shift_median_pct']:+.2f}%")
        summary[name] = row
    report["summary"] = summary


def med(xs):
    xs = sorted(xs)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def markdown(report: dict) -> str:
    env = report["environment"]
    cfg = report["perf_config"]
    lines = [
        "# Speed gate sensitivity on one GPU", "",
        f"Produced by `{report['invocation']}` (from the repository root; results copied from `$OUT`).", "",
        f"- GPU {env.get('gpu_name')} (class `{env.get('gpu_class')}`), driver {env.get('driver')}, CUDA {env.get('cuda')}, "
        f"torch {env.get('torch')}, Python {report.get('python')}",
        f"- candidate `{CANDIDATE}`, anchor per shape below; rule: FAIL when the speed ratio is worse by more than "
        f"max({cfg['regression_pct']:g}%, {cfg['noise_k']:g} x noise), significant at alpha {cfg['alpha']:g}, and confirmed "
        f"by a {cfg['confirm_rounds']}-round re-run; INCONCLUSIVE when {cfg['noise_k']:g} x noise > {cfg['max_noise_pct']:g}%",
        f"- one check = {cfg['rounds']} interleaved rounds x {cfg['calls_per_round']} calls per kernel and pass, cold L2, "
        f"warm-up {report['trial_warmup_s']} s between back-to-back trials (the gate's default is {cfg['warmup_s']} s); "
        f"baselines {cfg['confirm_rounds']} rounds",
        f"- torch.cuda._sleep: {report.get('sleep_cycles_per_ms', float('nan')):.0f} cycles/ms; wall "
        f"{report.get('wall_s', float('nan')):.0f} s; throttled checks are counted per row", "",
        "## Shapes and baselines", "",
        "| shape | anchor | ratio fwd (noise) | ratio bwd (noise) | flash fwd ms | flash bwd ms | TFLOP/s fwd / bwd | profiler |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, sh in report["shapes"].items():
        if "baseline" not in sh:
            continue
        b = sh["baseline"]
        lines.append(f"| `{sh['case_id']}` | {sh['anchor']} | {b['fwd']['median']:.4f} ({b['fwd']['noise'] * 100:.2f}%) | "
                     f"{b['bwd']['median']:.4f} ({b['bwd']['noise'] * 100:.2f}%) | {sh['candidate_ms']['fwd']:.3f} | "
                     f"{sh['candidate_ms']['bwd']:.3f} | {sh['tflops']['fwd']:.0f} / {sh['tflops']['bwd']:.0f} | "
                     f"{sh.get('profiler', {}).get('summary', '-')} |")
    lines += ["", "## A/A (unchanged kernel) and planted slowdowns", "",
              "| experiment | trials | pass | FAIL (gate as configured) | FAIL without confirm | INCONCLUSIVE | measured shift median [min, max] | noise median | FAIL at regression_pct "
              + " / ".join(f"{p:g}" for p in TABLE_PCTS) + " | throttled | s per check |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in report.get("summary", {}).items():
        exp = report["experiments"][name]
        passes = ("fwd", "bwd") if exp["kind"] == "aa" else (exp["pass_"],)
        for p in passes:
            r = row[p]
            table = " / ".join(str(r["fail_by_regression_pct"][f"{x:g}"]) for x in TABLE_PCTS)
            lines.append(f"| {name} | {row['trials']} | {p} | {r['fail']} | {r['fail_without_confirm']} | {r['inconclusive']} | "
                         f"{r['measured_shift_median_pct']:+.2f}% [{r['measured_shift_min_pct']:+.2f}, {r['measured_shift_max_pct']:+.2f}] | "
                         f"{r['noise_median_pct']:.2f}% | {table} | {row['throttled']} | {row['wall_s_median']:.2f} |")
    lines += ["", "Reading: for A/A rows FAIL counts are false alarms; for planted rows they are detections. "
              "Planted delays are one extra `_sleep` kernel sized to the pass's own time, so the measured shift "
              "can exceed the nominal one; the measured shift is what the gate saw. 's per check' of the A/A rows is "
              "the cost of gating one case (both passes, confirm re-runs included); planted rows time one pass.", ""]
    if report["dropped"]:
        lines += ["Dropped for the time budget: " + "; ".join(report["dropped"]), ""]
    if report["errors"]:
        lines += ["Errors:", ""] + [f"- {e}" for e in report["errors"]] + [""]
    return "\n".join(lines)


def write(report: dict) -> None:
    from gate.core.jsonio import write_json_atomic, write_text_atomic

    write_json_atomic(OUT / "perf-sensitivity.json", report)
    write_text_atomic(OUT / "perf-sensitivity.md", markdown(report))


def print_table(report: dict) -> None:
    print("\n" + "=" * 100)
    for name, row in report.get("summary", {}).items():
        print(f"{name:28} {row['headline']}  ({row['wall_s_median']:.2f} s/check, throttled {row['throttled']})")
    for key, sh in report["shapes"].items():
        print(f"{key:28} profiler: {sh.get('profiler', {}).get('summary', '-')}")
    if report["dropped"]:
        print("dropped:", "; ".join(report["dropped"]))
    if report["errors"]:
        print("errors:", *report["errors"], sep="\n  ")
    print(f"wrote {OUT / 'perf-sensitivity.md'} and {OUT / 'perf-sensitivity.json'}; wall {time.perf_counter() - T0:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
