"""The worker measures what run_case measures in one process, for every feature merged
after it: dBias of a trainable bias, the layout views and their dO, varlen keys,
the LSE against its float32 yardstick, dropout, the probes, the traceback of a kernel that
raises, and the entry points: decode with a (paged) KV cache judged on the cache after
the call, sinks and dsink, forward-only kernels, kernel families built in the worker.

The same case is run in this process (`run_case`) and through a worker (`WorkerPool.run_case`):
the rows must be the same tensor for tensor, and a planted bug of each feature must fail through
the worker as it does in one process. Cases are tiny (one seed, <= 24 tokens); each user kernel
costs one worker start (~1-2 s)."""

from __future__ import annotations

import pytest

import gate.correctness.run_case as run_case_module
from gate.core.cases import Case
from gate.core.config import IsolationConfig, KernelFamily, ToleranceConfig
from gate.core.results import Status
from gate.correctness.probes.registry import checks_for
from gate.correctness.run_case import run_case
from gate.kernels.registry import get_adapter
from gate.workflow.isolation import WorkerPool

TOL = ToleranceConfig()


def tiny(**kw) -> Case:
    base = dict(
        batch=1, seqlen_q=17, seqlen_k=17, heads_q=2, heads_kv=2, head_dim=8, head_dim_v=8, dtype="fp32", seeds=(0,)
    )
    return Case.build(**{**base, **kw})


FEATURE_CASES = {
    "dbias": tiny(bias="dense", bias_grad=True),
    "dbias_fp32_bias_bf16": tiny(dtype="bf16", bias="broadcast_h", bias_dtype="fp32", bias_grad=True),
    "bool_mask": tiny(bias="bool_empty_rows"),
    "k_sliced": tiny(layout="k_sliced", dtype="bf16"),
    "qkv_packed": tiny(layout="qkv_packed", heads_q=4, heads_kv=2),
    "bhsd_view": tiny(layout="bhsd_view"),
    "dout_noncontig": tiny(layout="dout_noncontig", dtype="bf16"),
    "varlen_k": tiny(batch=2, seqlen_q=9, seqlen_k=13, varlen=(5, 9), varlen_k=(13, 7), causal=True),
    "dropout": tiny(dropout_p=0.2),
    # the kernel's keep mask is a list of per-sequence masks here (an ERROR row on the H200 nightly,
    # the worker once called .detach() on the list)
    "dropout_varlen": tiny(batch=2, seqlen_q=13, seqlen_k=13, varlen=(5, 13), dropout_p=0.2, causal=True),
    "determinism_probe": tiny(checks=("determinism",)),
    "sinks_dsink": tiny(sinks=True),
    "decode_paged": tiny(
        batch=2,
        seqlen_q=2,
        seqlen_k=40,
        heads_q=4,
        heads_kv=2,
        dtype="bf16",
        entry="kvcache",
        cache_seqlens=(5, 30),
        cache_new=True,
        causal=True,
        page_size=8,
        shuffled_pages=True,
    ),
    "decode_sinks": tiny(batch=2, seqlen_q=1, seqlen_k=24, entry="kvcache", cache_seqlens=(3, 20), sinks=True),
}


def _row(result) -> dict:
    d = result.to_dict()
    d.pop("seconds", None)
    return d


@pytest.fixture(scope="module")
def tiled_pool():
    with WorkerPool("tiled", "cpu", 1, IsolationConfig()) as pool:
        yield pool


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FEATURE_CASES))
@pytest.mark.xdist_group("isolation_features")
def test_the_worker_measures_what_one_process_measures(name, tiled_pool):
    case = FEATURE_CASES[name]
    here = run_case(get_adapter("tiled"), case, "cpu", TOL, checks_for(case, ()))
    isolated = tiled_pool.run_case(case, TOL, (), None)
    assert here.status is Status.PASS, here.reason
    assert _row(isolated) == _row(here)
    measured = {t.tensor for t in isolated.tensors}
    if case.entry.kind == "kvcache":  # forward-only, judged on the cache after the call too
        assert isolated.forward_only and measured == {"out", "lse", "k_cache", "v_cache"}
    else:
        assert measured >= {"out", "lse", "dq", "dk", "dv"} and not isolated.forward_only
    assert ("dbias" in measured) == case.bias.grad
    assert ("dsink" in measured) == (case.entry.sinks and case.entry.kind != "kvcache")
    if case.checks:
        assert [c.name for c in isolated.checks] == list(case.checks) and all(c.passed for c in isolated.checks)


# (kernel, case, what the FAIL row must say): one planted bug per feature, judged through the worker
PLANTED = [
    ("tests.bias_kernels:bias_no_grad", tiny(bias="dense", bias_grad=True), "dbias is missing"),
    ("tests.bias_kernels:bias_head0", tiny(bias="dense"), "out error"),
    ("tests.coverage_kernels:assumes_contiguous", tiny(layout="k_sliced"), "error"),
    ("tests.coverage_kernels:dout_assumed_contiguous", tiny(layout="dout_noncontig"), "dq error"),
    ("tests.coverage_kernels:lse_bias_1e_3", tiny(dtype="bf16"), "lse error"),
]


@pytest.mark.slow
@pytest.mark.parametrize("kernel,case,words", PLANTED, ids=[k.split(":")[1] for k, _, _ in PLANTED])
def test_each_features_planted_bug_fails_through_the_worker_as_in_one_process(kernel, case, words):
    here = run_case(get_adapter(kernel), case, "cpu", TOL)
    with WorkerPool(kernel, "cpu", 1, IsolationConfig()) as pool:
        isolated = pool.run_case(case, TOL, (), None)
    assert here.status is Status.FAIL and words in here.reason, here.reason
    assert _row(isolated) == _row(here)


DECODE = dict(
    batch=2,
    seqlen_q=2,
    seqlen_k=40,
    heads_q=4,
    heads_kv=2,
    dtype="bf16",
    entry="kvcache",
    cache_seqlens=(5, 30),
    cache_new=True,
    causal=True,
    page_size=8,
    shuffled_pages=True,
)
# (family, case, what the row must say): a family's entry points are imported in the worker only
FAMILIES = [
    (
        KernelFamily(name="fam", kvcache="tests.entry_kernels:attn_with_kvcache_no_append"),
        tiny(**DECODE),
        "k_cache error",
    ),
    (KernelFamily(name="fam", kvcache="tests.entry_kernels:attn_with_kvcache_contiguous"), tiny(**DECODE), "error"),
    (
        KernelFamily(name="fam", dense="tests.entry_kernels:attn_func_ignores_sink"),
        tiny(sinks=True),
        "dsink is missing",
    ),
    (KernelFamily(name="fam", dense="tests.entry_kernels:attn_func", backward=False), tiny(), "forward-only"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,case,words", FAMILIES, ids=["no_append", "pages_contiguous", "ignores_sink", "forward_only"]
)
def test_a_kernel_family_runs_in_the_worker_and_is_judged_as_in_one_process(family, case, words):
    from gate.kernels.user import FamilyAdapter

    here = run_case(FamilyAdapter(family), case, "cpu", TOL)
    with WorkerPool("fam", "cpu", 1, IsolationConfig(), family) as pool:
        isolated = pool.run_case(case, TOL, (), None)
    assert words in here.reason and here.status is (Status.PASS if words == "forward-only" else Status.FAIL), (
        here.reason
    )
    assert _row(isolated) == _row(here)
    if not family.backward:
        assert isolated.forward_only and not {"dq", "dk", "dv"} & {t.tensor for t in isolated.tensors}


@pytest.mark.slow
def test_a_kernel_that_raises_in_its_worker_is_an_error_row_with_its_traceback():
    case = tiny()
    with WorkerPool("tests.buggy_kernels:raises", "cpu", 1, IsolationConfig()) as pool:
        row = pool.run_case(case, TOL, (), None)
    assert row.status is Status.ERROR and row.reason.startswith("RuntimeError: planted crash")
    assert "Traceback" in row.traceback and "buggy_kernels.py" in row.traceback and "second line" in row.traceback


@pytest.mark.slow
def test_a_dead_worker_leaves_its_stderr_tail_as_the_rows_traceback(monkeypatch):
    monkeypatch.setenv("ATTN_GATE_TEST_FAULT", "segfault")
    with WorkerPool("tests.fault_kernels:by_env", "cpu", 1, IsolationConfig()) as pool:
        row = pool.run_case(tiny(), TOL, (), None)
    assert row.status is Status.ERROR and "SIGSEGV" in row.reason
    assert "Fatal Python error" in row.traceback


# (kernel, status, what the row says): each rung of the exception ladder, planted in a kernel
LADDER = [
    ("tests.buggy_kernels:refuses", Status.SKIP, "planted refusal: no kernel for this case"),
    ("tests.buggy_kernels:wrong_shape", Status.FAIL, "seed 1: out has shape (1, 2, 17, 8), expected (1, 17, 2, 8)"),
    ("tests.buggy_kernels:returns_nan", Status.FAIL, "seed 1: out contains NaN/Inf"),
    ("tests.buggy_kernels:raises", Status.ERROR, "RuntimeError: planted crash: kernel launch failed"),
    ("tests.exiting_kernels:exits_one", Status.ERROR, "SystemExit: 1"),
]


@pytest.mark.slow
@pytest.mark.parametrize("kernel,status,reason", LADDER, ids=[k.split(":")[1] for k, _, _ in LADDER])
def test_an_exception_from_a_kernel_makes_the_same_row_in_one_process_and_in_a_worker(kernel, status, reason):
    case = tiny(seeds=(1, 2))
    here = run_case(get_adapter(kernel), case, "cpu", TOL)
    with WorkerPool(kernel, "cpu", 1, IsolationConfig()) as pool:
        isolated = pool.run_case(case, TOL, (), None)
    assert (here.status, here.reason) == (status, reason)
    assert (isolated.status, isolated.reason) == (status, reason)
    # the same frames up to the kernel (the two executors' steps differ in name only), the same error
    assert here.traceback.splitlines()[-1:] == isolated.traceback.splitlines()[-1:]
    assert ("Traceback" in here.traceback) == (status is Status.ERROR)


def test_both_executors_run_one_seed_loop(monkeypatch, tmp_path):
    """run_case (this process) and the worker's run_one run the kernel through `run_seeds`, and
    the worker's outputs are judged here through the same `seed_loop`: the ladder exists once."""
    from gate.workflow.isolation import judge_raw_outputs
    from gate.workflow.worker_main import run_one

    calls = []
    real_loop, real_seeds = run_case_module.seed_loop, run_case_module.run_seeds

    def seed_loop(case, device, step):
        calls.append(("seed_loop", case.id))
        return real_loop(case, device, step)

    def run_seeds(adapter, case, device, step, extra_checks=()):
        calls.append(("run_seeds", case.id))
        return real_seeds(adapter, case, device, step, extra_checks)

    monkeypatch.setattr(run_case_module, "seed_loop", seed_loop)
    monkeypatch.setattr(run_case_module, "run_seeds", run_seeds)
    case, adapter = tiny(seeds=(1, 2)), get_adapter("tiled")
    here = run_case(adapter, case, "cpu", TOL)
    assert calls == [("run_seeds", case.id), ("seed_loop", case.id)]
    calls.clear()
    file = tmp_path / "case.pt"
    reply = run_one(adapter, {"case": case.to_dict(), "file": str(file)}, "cpu")
    assert reply["status"] == "RAN" and calls == [("run_seeds", case.id), ("seed_loop", case.id)]
    calls.clear()
    judged = judge_raw_outputs(case, file, "cpu", TOL, reply, run_case_module.KernelTraits.of(adapter), 0.0)
    assert calls == [("seed_loop", case.id)]
    assert here.status is Status.PASS and _row(judged) == _row(here)


def test_an_error_asks_for_a_fresh_worker_after_a_cuda_fault_named_or_pending(monkeypatch):
    """A kernel that raises its own error after a launch that faulted: the fault is still pending
    (the next synchronisation would raise it), so the worker must not serve another case, even in
    the probe, which keeps a worker whose kernel merely raised."""
    import torch

    from gate.correctness.run_case import Ended
    from gate.workflow import worker_main

    raised = Ended(status=Status.ERROR, reason="ValueError: no", traceback="tb", exception="ValueError no")
    named = Ended(status=Status.ERROR, reason="x", traceback="tb", exception="AcceleratorError CUDA error: boom")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    assert worker_main.ended_reply(raised, "cuda", kept=True)["restart"] is False
    assert worker_main.ended_reply(named, "cuda")["restart"] is True

    def pending(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", pending)
    assert worker_main.ended_reply(raised, "cuda", kept=True)["restart"] is True
    assert worker_main.ended_reply(raised, "cpu", kept=True)["restart"] is False
    # where an ERROR ends the worker anyway (the sweep), it does not wait on the GPU at all
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronized"))
    assert worker_main.ended_reply(raised, "cuda")["restart"] is False
    skip = worker_main.ended_reply(Ended(status=Status.SKIP, reason="no window"), "cuda")
    assert skip == {"status": "SKIP", "reason": "no window"}
