"""Render sweep results: a terminal table and the Markdown validation note. Reads results
only; decides nothing (the status of each case was decided in gate.correctness.run_case)."""

from __future__ import annotations

from pathlib import Path

from gate.core.files import safe_name
from gate.core.jsonio import write_text_atomic
from gate.core.results import CaseResult, Status, SweepResult, shown_tensors
from gate.report import terminal_console


def _ratio_cells(c: CaseResult, names: tuple[str, ...]) -> list[str]:
    cells = []
    for name in names:
        t = c.tensor(name)
        cells.append("-" if t is None else f"{t.ratio:.2f}")
    return cells


def print_table(result: SweepResult, console=None, show_passing: bool = True) -> None:
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = terminal_console()
    table = Table(title=f"{result.kernel} / {result.suite}: error ratio = err / bound (pass <= 1)")
    table.add_column(
        "case", no_wrap=True, min_width=max((len(c.case_id) for c in result.cases), default=4)
    )  # never cut
    table.add_column("status", min_width=5)  # a narrow terminal squeezes the ratio columns, never the id or status
    names = shown_tensors(result.cases)
    for name in names:
        table.add_column(name, justify="right", overflow="fold")
    table.add_column("reason", overflow="fold")
    style = {Status.PASS: "green", Status.FAIL: "bold red", Status.ERROR: "bold red", Status.SKIP: "yellow"}
    for c in result.cases:
        if c.status is Status.PASS and not show_passing:
            continue
        table.add_row(
            escape(c.case_id), f"[{style[c.status]}]{c.status.value}[/]", *_ratio_cells(c, names), escape(c.reason)
        )
    console.print(table)
    console.print(summary_line(result), highlight=False, markup=False)


def summary_line(result: SweepResult) -> str:
    counts = ", ".join(f"{result.count(s)} {s.value.lower()}" for s in Status)
    measured = [c for c in result.cases if c.tensors]
    worst = max(measured, key=lambda c: c.worst_ratio, default=None)
    tail = f"; worst ratio {worst.worst_ratio:.2f} ({worst.case_id})" if worst else ""
    verdict = "PASS" if result.passed else "FAIL"
    return f"{verdict}: {result.kernel} on {result.suite}: {counts}{tail}; {result.wall_s:.1f}s"


def validation_note(result: SweepResult) -> str:
    env = result.env
    lines = [
        f"# Validation note: `{result.kernel}` on suite `{result.suite}`",
        "",
        f"**{summary_line(result)}**",
        "",
        f"- device: {env.gpu_name if env.gpu_name is not None else 'cpu'} (class `{env.gpu_class}`), driver "
        f"{env.driver}, CUDA {env.cuda}, torch {env.torch}, kernel version {env.kernel_version}",
        f"- started {result.started_at}, wall {result.wall_s:.1f}s, suite hash `{result.suite_hash}`",
        "",
        "## The rule",
        "",
        "Per case, tensor and seed: `bound = mult * max|P - G| + floor`, `ratio = max|K - G| / bound`, pass when",
        "ratio <= 1 (G: float64 reference, P: the same math in the input dtype, K: the kernel, floor: twice the",
        "dtype's rounding near the reference values). The worst seed counts. Multipliers: "
        + ", ".join(f"{k.removeprefix('mult_')} x{v:g}" for k, v in sorted(result.tolerance.items()))
        + ".",
        "The common fixed tolerance band (bf16 5e-3, fp16 1e-3, fp32 1e-5/1e-4) is shown as information only.",
        "",
    ]
    if any(c.forward_only for c in result.cases):  # say what a forward-only pass covers
        lines += [
            "Forward-only rows (decode cases; a kernel declared `backward = false`) have no gradients: they are",
            "judged on out and the LSE where the kernel returns it, and decode rows also on the cache after the",
            "call (`k_cache`, `v_cache`: appended tokens where they belong, every other slot untouched, exact).",
            "",
        ]
    measured = [c for c in result.cases if c.status is not Status.SKIP]
    failed = [c for c in result.cases if c.status.failed]
    skipped = [c for c in result.cases if c.status is Status.SKIP]
    if failed:
        lines += ["## Failures", ""]
        lines += [f"- `{c.case_id}`: **{c.status.value}** {c.reason}" for c in failed]
        lines.append("")
    lines += [
        "## Validated",
        "",
        f"{len(measured)} cases measured (seeds per case: {measured[0].case.seeds if measured else '-'}).",
        "",
    ]
    names = shown_tensors(result.cases)
    lines.append("| case | status | " + " | ".join(names) + " | worst headroom | outside fixed band |")
    lines.append("|---|---|" + "---|" * len(names) + "---|---|")
    for c in measured:
        headroom = f"{1 - c.worst_ratio:.2f}" if c.tensors else "-"
        outside = ", ".join(t.tensor for t in c.tensors if not t.band_ok) or "-"
        lines.append(
            f"| `{c.case_id}` | {c.status.value} | "
            + " | ".join(_ratio_cells(c, names))
            + f" | {headroom} | {outside} |"
        )
    lines.append("")
    checks = [(c.case_id, k) for c in measured for k in c.checks]
    if checks:
        lines += [
            "## Further checks",
            "",
            "| case | check | passed | value | limit | detail |",
            "|---|---|---|---|---|---|",
        ]
        for case_id, k in checks:
            passed = {True: "yes", False: "**NO**", None: "info"}[k.passed]
            lines.append(f"| `{case_id}` | {k.name} | {passed} | {k.value:.4g} | {k.limit:.4g} | {k.detail} |")
        lines.append("")
    lines += ["## Skipped (not validated)", ""]
    if skipped:
        lines += [f"- `{c.case_id}`: {c.reason}" for c in skipped]
    else:
        lines.append("- none")
    notes = ((f"filtered with --only {result.scope.only!r}",) if not result.scope.whole else ()) + tuple(result.notes)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_sweep_outputs(result: SweepResult, out_dir: Path, suffix: str = "") -> dict[str, Path]:
    """The sweep JSON and its validation note, under the names every command uses (`suffix`: a
    check rerun's, so its files sit beside the full run's). Here, not in workflow/sweep.py, so
    that writing results (merge, check --results) does not import torch."""
    stem = f"{safe_name(result.kernel)}-{result.suite}{suffix}"
    paths = {"json": Path(out_dir) / f"sweep-{stem}.json", "note": Path(out_dir) / f"validation-{stem}.md"}
    note = validation_note(result)  # composed first: a note that cannot be made leaves no JSON without one
    result.write(paths["json"])
    write_text_atomic(paths["note"], note)
    return paths
