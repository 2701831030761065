"""Case ids and suite hashes are pinned: baselines name cases by id and refuse another suite by
hash, so a change to how a Case is built or stored must leave both byte-identical.

tests/data/case_ids.json.gz holds, per built-in suite, its hash, its case ids in order and each
case as the first case schema wrote it (a flat dict, defaults of later fields left out).
"""

import gzip
import json
from pathlib import Path

import pytest

from gate.core.cases import Case, load_suite, suite_hash

PINNED = json.loads(gzip.decompress((Path(__file__).parent / "data" / "case_ids.json.gz").read_bytes()))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_ids_and_hash_unchanged(name):
    suite = load_suite(name)
    assert [c.id for c in suite.cases] == PINNED[name]["ids"]
    assert suite_hash(suite) == PINNED[name]["suite_hash"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_first_schema_cases_read_back_as_the_same_cases(name):
    suite = load_suite(name)
    assert tuple(Case.from_dict(d) for d in PINNED[name]["cases"]) == suite.cases
