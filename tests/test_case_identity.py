"""Case ids and suite hashes are pinned: baselines name cases by id and refuse another suite by
hash, so a change to how a Case is built or stored must leave both byte-identical.

tests/data/case_ids.json.gz holds, per built-in suite, its hash, its case ids in order and each
case as the first case schema wrote it (a flat dict, defaults of later fields left out). A suite
changed on purpose (its baselines regenerated with it) is re-pinned with
`python -c "from tests.test_case_identity import repin; repin()"`.
"""

import gzip
import json
from pathlib import Path

import pytest

from gate.core.cases import (
    CASE_SCHEMA_VERSION,
    PARTS,
    Bias,
    Case,
    Entry,
    Masking,
    Shape,
    load_suite,
    migrate_case,
    suite_hash,
)
from gate.speed.runs import SCHEMA_VERSION as PERF_SCHEMA_VERSION
from gate.speed.runs import PerfResult, migrate_perf

DATA = Path(__file__).parent / "data"
PINNED = json.loads(gzip.decompress((DATA / "case_ids.json.gz").read_bytes()))


def repin() -> None:
    """Rewrite the pin from the suites as they are now (after a deliberate change to a suite)."""
    pinned = {}
    for name in sorted(PINNED):
        suite = load_suite(name)
        pinned[name] = {
            "suite_hash": suite_hash(suite),
            "ids": [c.id for c in suite.cases],
            "cases": [c.hash_dict() for c in suite.cases],
        }
    (DATA / "case_ids.json.gz").write_bytes(gzip.compress(json.dumps(pinned, sort_keys=True).encode(), mtime=0))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_ids_and_hash_unchanged(name):
    suite = load_suite(name)
    assert [c.id for c in suite.cases] == PINNED[name]["ids"]
    assert suite_hash(suite) == PINNED[name]["suite_hash"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_first_schema_cases_read_back_as_the_same_cases(name):
    suite = load_suite(name)
    assert tuple(Case.from_dict(d) for d in PINNED[name]["cases"]) == suite.cases


# ---- the case dict, one test per schema version (format history in gate/core/cases.py)


def test_version_1_flat_dicts_migrate_to_the_nested_parts():
    flat = PINNED["smoke"]["cases"]
    for d in flat:
        nested = migrate_case(d)
        assert nested["schema_version"] == CASE_SCHEMA_VERSION and set(PARTS) <= set(nested)
        assert Case.from_dict(nested).hash_dict() == d  # nothing lost or added on the way


@pytest.mark.parametrize("name", sorted(PINNED))
def test_version_2_round_trips_through_json(name):
    for case in load_suite(name).cases:
        data = json.loads(json.dumps(case.to_dict()))
        assert data["schema_version"] == 2 and Case.from_dict(data) == case


def test_a_case_is_built_from_flat_names_and_changed_by_them():
    case = Case.build(
        batch=2,
        seqlen_q=8,
        seqlen_k=8,
        heads_q=2,
        heads_kv=1,
        head_dim=16,
        head_dim_v=16,
        dtype="bf16",
        causal=True,
        sinks=True,
        bias="dense",
        bias_grad=True,
    )
    assert case.shape == Shape(2, 8, 8, 2, 1, 16, 16, "bf16") and case.masking == Masking(causal=True)
    assert case.entry == Entry(sinks=True) and case.bias == Bias(kind="dense", grad=True)
    assert case.with_fields(batch=4).batch == 4 and case.with_fields(batch=4).bias == case.bias


@pytest.mark.parametrize(
    "data, message",
    [
        ({"schema_version": 9}, "case schema_version 9 is not one this attn-gate reads"),
        ({**PINNED["smoke"]["cases"][0], "colour": "red"}, "unknown case field 'colour'"),
        ({"schema_version": 2, "shape": {}, "hue": 1}, "unknown case field 'hue'"),
        ([1, 2], "a case must be an object"),
    ],
)
def test_an_unreadable_case_dict_names_what_is_wrong(data, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Case.from_dict(data)


def test_a_part_is_checked_as_part_of_its_case():
    with pytest.raises(TypeError, match="masking must be a Masking"):
        Case(shape=Shape(2, 8, 8, 2, 2, 16, 16, "bf16"), masking=Entry())
    with pytest.raises(ValueError, match="dropout_p must be in"):
        Case(shape=Shape(2, 8, 8, 2, 2, 16, 16, "bf16"), masking=Masking(dropout_p=2.0))


# ---- the perf results that embed cases, one test per version


def test_perf_version_1_reads_and_rewrites_as_the_current_version(tmp_path):
    payload = json.loads(gzip.decompress((DATA / "h200-perf-sdpa-flash-pr.json.gz").read_bytes()))
    assert payload["schema_version"] == 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(payload))
    perf = PerfResult.read(path)
    assert [c.case.hash_dict() for c in perf.cases] == [row["case"] for row in payload["cases"]]
    assert migrate_perf(payload)["schema_version"] == PERF_SCHEMA_VERSION == 3
    again = tmp_path / "v3.json"
    perf.write(again)
    data = json.loads(again.read_text())
    assert data["schema_version"] == PERF_SCHEMA_VERSION and data["cases"][0]["case"]["schema_version"] == 2
    assert PerfResult.read(again).cases == perf.cases
