"""The sweep results format, one test per schema version: every version a run ever wrote still reads.

Version 1 files are real runs (tests/data, a CPU and an H200 sweep); version 2 is the same with
`scope` a field; version 3 has the cases in the nested case schema 2; version 4 is what this code
writes (each tensor's mean-error rule). A version 1 file filtered with --only kept the regex in a
note; it reads as the `scope` field. Files before version 4 read with their tensors unjudged by the
mean rule, and the commands that judge stored rows refuse them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gate.core.identity import Scope
from gate.core.results import SCHEMA_VERSION, SweepResult, TensorError, migrate_results

DATA = Path(__file__).parent / "data"
V1_FILES = ("cpu-sweep-sdpa-cpu-smoke.json.gz", "h200-sweep-sdpa-flash-pr.json.gz")


def v1_payload(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / name).read_bytes()))


@pytest.mark.parametrize("name", V1_FILES)
def test_version_1_reads_and_rewrites_as_the_current_version(name, tmp_path):
    payload = v1_payload(name)
    assert payload["schema_version"] == 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(payload))
    sweep = SweepResult.read(path)
    assert sweep.scope.whole and len(sweep.cases) == len(payload["cases"])
    assert sweep.notes == tuple(payload["notes"])
    again = tmp_path / "v4.json"
    sweep.write(again)
    data = json.loads(again.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 4 and data["scope"] is None
    assert SweepResult.read(again) == sweep


def test_version_1_only_note_becomes_the_scope(tmp_path):
    payload = v1_payload(V1_FILES[0])
    first = payload["cases"][0]["case_id"]
    payload.update(notes=[*payload["notes"], f"filtered with --only {first!r}"], cases=payload["cases"][:1])
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(payload))
    sweep = SweepResult.read(path)
    assert sweep.scope == Scope(first)
    assert not any("--only" in n for n in sweep.notes)  # the note became the field, not both


@pytest.mark.parametrize(
    "note, scope",
    [
        ("filtered with --only 's1-'", "s1-"),
        ("filtered with --only s1-", "s1-"),
        ("filtered with --only 'a\\\\d'", "a\\d"),
    ],
)
def test_migration_of_the_note_forms_version_1_wrote(note, scope):
    migrated = migrate_results({"schema_version": 1, "notes": ["other", note], "cases": []})
    assert (migrated["schema_version"], migrated["scope"], migrated["notes"]) == (4, scope, ["other"])


def test_version_2_keeps_the_scope_as_a_field(tmp_path):
    payload = v1_payload(V1_FILES[0])
    sweep = SweepResult.from_dict(migrate_results(payload))
    first = sweep.cases[0]
    filtered = SweepResult(**{**sweep.__dict__, "cases": (first,), "scope": Scope(first.case_id)})
    path = tmp_path / "v2.json"
    filtered.write(path)
    assert json.loads(path.read_text())["scope"] == first.case_id
    assert SweepResult.read(path).scope == Scope(first.case_id)


@pytest.mark.parametrize("name", V1_FILES)
def test_version_2_flat_cases_read_as_the_nested_case_schema(name, tmp_path):
    payload = {**v1_payload(name), "schema_version": 2, "scope": None}  # version 2 = 1 with the scope field
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(payload))
    sweep = SweepResult.read(path)
    assert [c.case.hash_dict() for c in sweep.cases] == [row["case"] for row in payload["cases"]]
    migrated = migrate_results(payload)
    assert migrated["schema_version"] == 4 and all(row["case"]["schema_version"] == 2 for row in migrated["cases"])
    again = tmp_path / "v3.json"
    sweep.write(again)
    assert all(row["case"]["schema_version"] == 2 for row in json.loads(again.read_text())["cases"])
    assert SweepResult.read(again) == sweep


def test_a_tensor_error_is_built_by_keyword_only():
    """Thirteen numbers of one type side by side: a positional call that swaps two is refused."""
    fields = dict(tensor="dq", max_err=0.01, mean_err=0.001, pt_err=0.004, floor=0.002, mult=2.0, bound=0.01)
    fields.update(ratio=1.0, worst_index=(0,), band_atol=5e-3, band_rtol=5e-3, band_ok=True, seed=0)
    assert TensorError(**fields).ratio == 1.0
    with pytest.raises(TypeError):
        TensorError(*fields.values())
