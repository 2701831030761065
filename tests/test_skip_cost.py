"""A case the kernel does not support costs nothing: no round trip to a worker, no inputs, no
references. The worker is asked about every case at once before the first runs."""

from __future__ import annotations

import pytest

import gate.attention.inputs as inputs_module
import gate.correctness.run_case as run_case_module
from gate.core.cases import Case
from gate.core.config import load_config
from gate.core.results import Status
from gate.workflow import isolation
from gate.workflow.sweep import SweepOptions, run_sweep


def _config(tmp_path):
    path = tmp_path / "gate.toml"
    # softcap cases need a `softcap` keyword tests.buggy_kernels:correct_out_only does not take: SKIP
    path.write_text(
        "[tool.attn-gate]\n[tool.attn-gate.suites.tiny]\nseeds = [0, 1]\n[[tool.attn-gate.suites.tiny.matrix]]\n"
        'dtype = ["fp32"]\nbatch = [1]\nseqlens = ["16", "19"]\nheads = ["2"]\nhead_dims = ["8"]\n'
        "causal = [false, true]\nsoftcap = [0.0, 30.0]\n"
    )
    return load_config(path)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 0])
def test_a_skipped_case_is_never_sent_to_a_worker_nor_given_inputs_or_references(tmp_path, monkeypatch, workers):
    calls = {"sent": [], "inputs": [], "references": []}
    real_call, real_inputs, real_refs = isolation.Worker.call, inputs_module.make_inputs, run_case_module.references

    def call(self, request, timeout, *args, **kwargs):
        case = request.get("case")
        calls["sent"].append((request.get("op"), Case.from_dict(case).id if case else None))
        return real_call(self, request, timeout, *args, **kwargs)

    def make_inputs(case, seed, device, *a, **kw):
        calls["inputs"].append(case.id)
        return real_inputs(case, seed, device, *a, **kw)

    def references(case, inputs, keep):
        calls["references"].append(case.id)
        return real_refs(case, inputs, keep)

    monkeypatch.setattr(isolation.Worker, "call", call)
    monkeypatch.setattr(inputs_module, "make_inputs", make_inputs)
    monkeypatch.setattr(run_case_module, "make_inputs", make_inputs)
    monkeypatch.setattr(run_case_module, "references", references)
    result = run_sweep(
        "tests.buggy_kernels:correct_out_only",
        "tiny",
        _config(tmp_path),
        device="cpu",
        progress=False,
        options=SweepOptions(workers=workers),
    )
    skipped = {r.case.id for r in result.cases if r.status is Status.SKIP}
    ran = {r.case.id for r in result.cases if r.status is Status.PASS}
    assert len(skipped) == 4 and len(ran) == 4, [(r.case.id, r.status, r.reason) for r in result.cases]
    assert all("softcap" in r.reason for r in result.cases if r.status is Status.SKIP)
    assert skipped.isdisjoint(calls["inputs"]) and skipped.isdisjoint(calls["references"])
    assert ran <= set(calls["references"])  # the same hooks see the cases that run: the test can see a call
    if workers:
        case_ids = {case_id for op, case_id in calls["sent"] if op == "case"}
        assert case_ids == ran, calls["sent"]
        assert [op for op, _ in calls["sent"]].count("triage") == 1
