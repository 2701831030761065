"""`attn-gate merge DIR... --out DIR`: shard results (`sweep --shard K/N`) joined into the sweep JSON a
single run would have written, for `attn-gate check --results` to judge.

Refused, with the folder, the key and both values (pyperf's rule: runs with different metadata
do not merge): another kernel, suite, suite definition, tolerance, --only scope or checks;
another environment (GPU class, driver, CUDA, torch, kernel version...); a folder that is not a
shard; shards of different N; a shard twice or missing; a shard that does not hold exactly the
cases `--shard K/N` gives it (a case missing, or run in two shards). The merged file's cases are in
suite order; started_at is the earliest shard's start and wall_s the longest shard's (the two
fields that differ from a single run by nature, with each case's `seconds`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gate.compare.comparable import same, why_not_comparable
from gate.core.cases import suite_hash
from gate.core.config import Config
from gate.core.errors import UserError
from gate.core.results import SweepResult
from gate.workflow.shards import assign, note_shard


def _shard_of(sweep: SweepResult, where: Path) -> tuple[int, int]:
    found = [s for s in map(note_shard, sweep.notes) if s]
    if len(found) != 1:
        raise UserError(
            f"{where}: not a shard's results (no 'shard K/N' note); merge folders written by "
            f"`attn-gate sweep --shard K/N`"
        )
    return found[0]


def read_shard(folder: Path) -> tuple[Path, SweepResult]:
    from gate.workflow.check import read_results

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"merge: {folder} is not a folder; pass the --out folder of each shard")
    files = sorted(folder.glob("sweep-*.json"))
    if len(files) != 1:
        raise UserError(
            f"merge: {folder} holds {len(files)} sweep-*.json files, expected 1 (one shard per --out folder)"
        )
    sweep = read_results(files[0], None, None)
    try:
        for note in sweep.notes:
            note_shard(note)
    except ValueError as exc:
        raise UserError(f"merge: {files[0]}: {exc}; regenerate the shard with `attn-gate sweep --shard K/N`") from None
    return files[0], sweep


def _field(sweep: SweepResult, key: str):
    """A field as the results file holds it (the scope as its regex)."""
    return sweep.scope.only if key == "scope" else getattr(sweep, key)


def merge_shards(folders: list[Path], config: Config) -> SweepResult:
    if not folders:
        raise UserError("merge: name the shards' --out folders")
    read = [read_shard(f) for f in folders]
    first_path, first = read[0]
    for path, sweep in read[1:]:
        differs = why_not_comparable(sweep.key, first.key, ("kernel", "suite", "suite_hash", "tolerance"))
        key = differs.key if differs is not None else "scope" if sweep.scope != first.scope else None
        if key is not None:
            raise UserError(
                f"merge: {path} has {key} {_field(sweep, key)!r} but {first_path} has "
                f"{_field(first, key)!r}; merge shards of one run only"
            )
        for key in sorted(set(sweep.environment) | set(first.environment)):
            if sweep.env.value(key) != first.env.value(key):
                raise UserError(
                    f"merge: {path} ran with environment {key}={sweep.env.value(key)!r} but {first_path} "
                    f"with {first.env.value(key)!r}; rerun the shards on machines of one kind"
                )
    shards = {}
    base_notes = None
    for path, sweep in read:
        k, n = _shard_of(sweep, path)
        notes = tuple(x for x in sweep.notes if not note_shard(x))
        if base_notes is None:
            base_notes, total = notes, n
        if n != total:
            raise UserError(f"merge: {path} is shard {k}/{n} but {first_path} is of {total} shards; merge one split")
        if notes != base_notes:
            raise UserError(
                f"merge: {path} ran with other options ({list(notes)}) than {first_path} ({list(base_notes)})"
            )
        if k in shards:
            raise UserError(f"merge: shard {k}/{n} is given twice ({shards[k][0]} and {path}); pass each shard once")
        shards[k] = (path, sweep)
    missing = [k for k in range(1, total + 1) if k not in shards]
    if missing:
        raise UserError(
            f"merge: shard {missing[0]}/{total} is missing ({len(shards)} of {total} given); pass every "
            f"shard's folder, or rerun it with `attn-gate sweep --shard {missing[0]}/{total} ...`"
        )
    suite = config.suite(first.suite)
    now = replace(first.key, suite_hash=suite_hash(suite))  # the shards' key, with the suite as defined now
    if not same(now, first.key, "suite_hash"):
        raise UserError(
            f"merge: the shards ran suite {first.suite!r} as defined then (hash {first.suite_hash}); "
            f"{config.source} defines it differently now ({suite_hash(suite)}); pass the --config they ran with"
        )
    cases = list(first.scope.select(suite.swept_cases))
    parts = assign(cases, total)
    merged = {}
    for k, (path, sweep) in sorted(shards.items()):
        expected = {c.id for c, p in zip(cases, parts) if p == k}
        got = [c.case_id for c in sweep.cases]
        extra = [cid for cid in got if cid not in expected]
        lost = sorted(expected - set(got))
        if extra:
            raise UserError(
                f"merge: {path} (shard {k}/{total}) holds {extra[0]}, which is not its case"
                f"{' (it belongs to another shard: overlap)' if any(c.id == extra[0] for c in cases) else ''}; "
                f"regenerate the shard with `attn-gate sweep --shard {k}/{total}`"
            )
        if lost:
            raise UserError(
                f"merge: {path} (shard {k}/{total}) lacks {len(lost)} of its cases ({', '.join(lost[:3])}"
                f"{' ...' if len(lost) > 3 else ''}); rerun it with --resume to finish it"
            )
        merged.update({c.case_id: c for c in sweep.cases})
    sweeps = [s for _, s in shards.values()]
    return SweepResult(
        kernel=first.kernel,
        suite=first.suite,
        suite_hash=first.suite_hash,
        environment=first.environment,
        cases=tuple(merged[c.id] for c in cases),
        tolerance=first.tolerance,
        started_at=min(s.started_at for s in sweeps),
        wall_s=max(s.wall_s for s in sweeps),
        notes=base_notes,
        scope=first.scope,
    )
