"""kernel families with several entry points, decode with a (paged) KV cache, sinks,
forward-only kernels. The acceptance test is `test_check_calls_every_entry_point_...` below: a
plain-PyTorch family (tests/entry_kernels.py) gated by `attn-gate check`, then the same family with
a bug planted in one entry point only."""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.attention.kvcache import expected_cache, gather_dense
from gate.attention.reference import AttnOptions, attention_reference
from gate.commands.main import main
from gate.compare.sweep_rules import required_tensors, rule_incomplete_pass
from gate.core.cases import Case, load_suite
from gate.core.config import ToleranceConfig, load_config
from gate.core.errors import UserError
from gate.core.results import Status
from gate.correctness.run_case import run_case
from gate.kernels.registry import get_adapter, kernel_entry
from tests import entry_kernels

ROOT = Path(__file__).resolve().parent.parent
TOL = ToleranceConfig()
DECODE = dict(
    batch=3,
    seqlen_q=4,
    seqlen_k=100,
    heads_q=4,
    heads_kv=2,
    head_dim=32,
    head_dim_v=32,
    dtype="bf16",
    entry="kvcache",
    cache_seqlens=(5, 60, 0),
    cache_new=True,
    causal=True,
)


# ---------------------------------------------------------------- cases


def test_defaults_leave_older_cases_and_their_ids_as_they_were():
    case = Case.build(
        batch=2, seqlen_q=128, seqlen_k=128, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64, dtype="bf16"
    )
    assert case.id == "bf16-b2-h4-s128-d64"
    assert not {"entry", "cache_seqlens", "cache_new", "page_size", "shuffled_pages", "sinks"} & set(case.hash_dict())
    assert case.entry_point == "dense" and not case.forward_only


def test_a_decode_case_has_a_readable_id_and_reads_back():
    case = Case.build(**DECODE, page_size=16, shuffled_pages=True, sinks=True)
    assert case.id == "bf16-b3-h4/2-s4x100-d32-causal-kv5.60.0-append-page16-shuffled-sinks"
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    assert case.entry_point == "kvcache" and case.forward_only
    assert case.key_lengths == (9, 64, 4)
    assert case.kv_bytes() == (9 + 64 + 4) * 2 * (32 + 32) * 2


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(cache_seqlens=(5, 97, 0)), "cannot hold cache_seqlens plus 4 appended tokens"),
        (dict(cache_seqlens=(5, 6)), "cache_seqlens has 2 lengths for batch 3"),
        (dict(shuffled_pages=True), "shuffled_pages needs a paged cache"),
        (dict(cache_seqlens=(0, 0, 0), cache_new=False), "needs at least one key"),
        (dict(entry="paged"), "entry 'paged' is not one of dense, kvcache"),
        (dict(entry="dense"), 'need entry = "kvcache"'),
    ],
)
def test_impossible_decode_cases_are_refused(changes, words):
    with pytest.raises(ValueError, match=words):
        Case.build(**{**DECODE, **changes})


def test_a_matrix_block_expands_ragged_cache_lengths_into_the_batch():
    suite = load_suite("smoke")
    paged = [c for c in suite.cases if c.entry.page_size]
    assert paged and all(c.batch == len(c.entry.cache_seqlens) for c in paged)
    assert {c.entry.shuffled_pages for c in paged} == {False, True}
    with pytest.raises(UserError, match="cache_seqlens value 7 should be a non-empty list"):
        from gate.core.cases import expand_block

        expand_block({"entry": ["kvcache"], "cache_seqlens": [7]}, (0,), "x")


# ---------------------------------------------------------------- the cache and the references


def test_a_shuffled_paged_cache_gathers_the_same_tokens_as_a_contiguous_one():
    """Same case and seed, cache laid out two ways: the references' gather must see identical K/V,
    and the slots past each element's tokens must differ from them (loud garbage, not zeros)."""
    contiguous = make_inputs(Case.build(**DECODE), 0, "cpu").cache
    paged = make_inputs(Case.build(**DECODE, page_size=16, shuffled_pages=True), 0, "cpu").cache
    assert paged.k_cache.shape[1] == 16 and paged.block_table.shape == (3, 7)
    assert sorted(paged.block_table.flatten().tolist()) != paged.block_table.flatten().tolist()
    for a, b in zip(gather_dense(contiguous, *expected_cache(contiguous)), gather_dense(paged, *expected_cache(paged))):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    garbage = contiguous.k_cache[0, 20:].float()
    assert garbage.mean() > 2.0  # shifted: a kernel that reads past cache_seqlens is visibly wrong


def test_the_expected_cache_holds_the_new_tokens_after_the_cached_ones():
    cache = make_inputs(Case.build(**DECODE, page_size=16, shuffled_pages=True), 0, "cpu").cache
    k_after, _ = expected_cache(cache)
    dense = gather_dense(cache, k_after, expected_cache(cache)[1])
    for b, cached in enumerate(cache.cache_seqlens.tolist()):
        assert torch.equal(dense[b][0][cached:], cache.k_new[b])
    assert (k_after != cache.k_cache).any(dim=(1, 2, 3)).sum() <= 3  # only the blocks the appends land in


def _naive_with_sink(q, k, v, sink, scale):
    """float64 autograd: the sink as an extra score column whose probability multiplies nothing."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = torch.cat([s, sink.view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def test_the_reference_sink_and_its_gradient_match_autograd():
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, n, 3, 8, generator=gen, dtype=torch.float64) for n in (5, 7, 7, 5))
    sink = torch.randn(3, generator=gen, dtype=torch.float64) + 1.5
    ref = attention_reference(q, k, v, dout, AttnOptions(softmax_scale=0.3), torch.float64, sink=sink)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sink)]
    out, lse = _naive_with_sink(*leaves, 0.3)
    grads = torch.autograd.grad(out, leaves, dout)
    for name, mine, theirs in zip(
        ("out", "lse", "dq", "dk", "dv", "dsink"), ref.tensors().values(), (out, lse, *grads)
    ):
        assert torch.allclose(mine, theirs.detach(), atol=1e-10), name


# ---------------------------------------------------------------- built-in adapters on decode


DECODE_SMOKE = [c for c in load_suite("smoke").cases if c.entry.kind == "kvcache"]


@pytest.mark.parametrize("case", DECODE_SMOKE, ids=lambda c: c.id)
def test_tiled_passes_every_decode_and_paged_case_of_smoke(case):
    result = run_case(get_adapter("tiled"), case, "cpu", TOL)
    assert result.status is Status.PASS, result.reason
    names = {t.tensor for t in result.tensors}
    assert {"out", "lse", "k_cache", "v_cache"} <= names and not names & {"dq", "dk", "dv"}
    assert result.forward_only and "forward-only" in result.reason


@pytest.mark.parametrize("kernel", ["sdpa-cpu", "sdpa-math"])
def test_sdpa_runs_decode_on_a_gathered_cache(kernel):
    # SDPA has no sinks, no softcap and no knobs
    for case in [c for c in DECODE_SMOKE if not c.entry.sinks and not c.softcap and not c.knobs.forced][::3]:
        result = run_case(get_adapter(kernel), case, "cpu", TOL)
        assert result.status is Status.PASS, (case.id, result.reason)
    sinks = next(c for c in DECODE_SMOKE if c.entry.sinks)
    assert run_case(get_adapter(kernel), sinks, "cpu", TOL).reason == "no learnable sinks"


@pytest.mark.parametrize("page_size", [0, 16])
def test_equal_cache_lengths_take_one_batched_call_and_still_pass(page_size):
    """The speed cases' shape (every element's cache full): SDPA is called once for the batch."""
    case = Case.build(
        **{**DECODE, "cache_seqlens": None, "seqlen_k": 40, "cache_new": False},
        page_size=page_size,
        shuffled_pages=bool(page_size),
    )
    adapter = get_adapter("sdpa-math")
    calls = []
    dense = adapter._dense
    adapter._dense = lambda *a, **k: calls.append(a[0].shape[0]) or dense(*a, **k)
    result = run_case(adapter, case, "cpu", TOL)
    assert result.status is Status.PASS, result.reason
    assert calls == [3] * len(case.seeds)  # the whole batch in one call per seed
    assert run_case(get_adapter("tiled"), case, "cpu", TOL).status is Status.PASS


@pytest.mark.slow
def test_flex_decode_mask_mods_pass_ragged_paged_and_biased_caches():
    """Flex runs decode as one call on a padded batch with a per-element length mask (one compile per
    case on a GPU). Here its mods run through eager flex_attention on the CPU: the masking logic is
    what is checked, not Flex's GPU kernel."""
    import dataclasses

    from gate.kernels.flex import FlexAdapter

    class EagerFlex(FlexAdapter):
        def capabilities(self):
            return dataclasses.replace(super().capabilities(), devices=("cpu", "cuda"))

        def _fn(self):
            from torch.nn.attention.flex_attention import flex_attention

            return flex_attention

    adapter = EagerFlex()
    for case in (
        Case.build(**DECODE),
        Case.build(**DECODE, page_size=7, shuffled_pages=True),
        Case.build(
            **{**DECODE, "causal": False, "cache_seqlens": (5, 60, 1), "heads_kv": 1},
            window=(8, 0),
            softcap=20.0,
            alibi=True,
            page_size=16,
        ),
    ):
        result = run_case(adapter, case, "cpu", TOL)
        assert result.status is Status.PASS, (case.id, result.reason)


def test_tiled_with_sinks_passes_dense_varlen_and_decode_and_reports_dsink():
    for case in [c for c in load_suite("smoke").cases if c.entry.sinks]:
        result = run_case(get_adapter("tiled"), case, "cpu", TOL)
        assert result.status is Status.PASS, (case.id, result.reason)
        if not case.forward_only:
            assert result.tensor("dsink") is not None


def test_a_kernel_declaring_no_sink_gradient_is_judged_without_dsink_and_says_so():
    import dataclasses

    from gate.kernels.tiled import TiledAdapter

    class NoSinkGrad(TiledAdapter):
        def capabilities(self):
            return dataclasses.replace(super().capabilities(), sink_grad=False)

    case = next(c for c in load_suite("smoke").cases if c.entry.sinks and c.entry.varlen is None and not c.forward_only)
    result = run_case(NoSinkGrad(), case, "cpu", TOL)
    assert result.status is Status.PASS and result.tensor("dsink") is None
    assert "dsink not judged: the adapter declares no sink gradient" in result.reason


# ---------------------------------------------------------------- kernel families: config


FAMILY = {
    "dense": "tests.entry_kernels:attn_func",
    "varlen": "tests.entry_kernels:attn_varlen_func",
    "kvcache": "tests.entry_kernels:attn_with_kvcache",
}

SUITE = """
[tool.attn-gate.suites.entry]
seeds = [0]

[[tool.attn-gate.suites.entry.matrix]]
seqlens = ["40x56"]
heads = ["4/2"]
head_dims = ["32"]
causal = [false, true]

[[tool.attn-gate.suites.entry.matrix]]
heads = ["4/2"]
head_dims = ["32"]
varlen = [[5, 40, 0, 23]]
causal = [false, true]

[[tool.attn-gate.suites.entry.matrix]]
entry = ["kvcache"]
seqlens = ["4x80"]
heads = ["4/2", "4/1"]
head_dims = ["32"]
cache_seqlens = [[3, 70, 41]]
cache_new = [false, true]
causal = [true]

[[tool.attn-gate.suites.entry.matrix]]
entry = ["kvcache"]
seqlens = ["3x80"]
heads = ["4/2"]
head_dims = ["32"]
cache_seqlens = [[9, 60]]
cache_new = [true]
page_size = [16]
shuffled_pages = [false, true]
causal = [true]
window = [[20, 0]]
softcap = [0.0, 15.0]

[[tool.attn-gate.suites.entry.matrix]]
seqlens = ["33x50"]
heads = ["4/2"]
head_dims = ["32"]
causal = [true]
sinks = [true]

[[tool.attn-gate.suites.entry.matrix]]
entry = ["kvcache"]
seqlens = ["2x80"]
heads = ["4/2"]
head_dims = ["32"]
cache_seqlens = [[9, 60]]
cache_new = [true]
page_size = [16]
shuffled_pages = [true]
sinks = [true]
"""


def write_config(tmp_path: Path, name: str = "mykernel", backward: bool = True, **entries) -> Path:
    spec = {**FAMILY, **entries}
    lines = [f'[tool.attn-gate]\nbaselines_dir = "{tmp_path / "baselines"}"\n', f"[tool.attn-gate.kernels.{name}]"]
    lines += [f'{key} = "{value}"' for key, value in spec.items() if value]
    lines.append(f"backward = {'true' if backward else 'false'}")
    path = tmp_path / f"pyproject-{len(list(tmp_path.glob('pyproject-*')))}.toml"
    path.write_text("\n".join(lines) + "\n" + SUITE)
    return path


@pytest.mark.parametrize(
    "table, words",
    [
        ('dense = "tests.entry_kernels:attn_func"\nprefill = "x:y"', "unknown key 'prefill'"),
        ('dense = "attn_func"', "dense = 'attn_func' should name a function as 'package.module:function'"),
        ("backward = false", "names no entry point"),
        ('dense = "a.b:c"\nbackward = "no"', "backward = 'no' should be true or false"),
    ],
)
def test_a_bad_family_table_is_a_one_line_error_naming_the_key(tmp_path, table, words):
    path = tmp_path / "pyproject.toml"
    path.write_text(f"[tool.attn-gate.kernels.mine]\n{table}\n")
    with pytest.raises(UserError, match=words) as info:
        load_config(path)
    assert str(path) in str(info.value) and "[tool.attn-gate].kernels.mine" in str(info.value)


def test_a_family_may_not_shadow_a_builtin_kernel(tmp_path):
    config = load_config(write_config(tmp_path, name="tiled"))
    with pytest.raises(UserError, match="'tiled' is a built-in kernel's name; rename the table"):
        kernel_entry("tiled", config)


def test_capabilities_come_from_each_entry_points_signature(tmp_path):
    config = load_config(write_config(tmp_path, varlen="tests.entry_kernels:attn_varlen_func_overread"))
    adapter = kernel_entry("mykernel", config).adapter()
    suite = load_suite("entry", config.suites)
    assert all(adapter.unsupported_reason(c, "cpu") is None for c in suite.cases)
    dense_only = kernel_entry("mykernel", load_config(write_config(tmp_path, varlen=None, kvcache=None))).adapter()
    reasons = {c.entry_point: dense_only.unsupported_reason(c, "cpu") for c in suite.cases}
    assert reasons["dense"] is None
    assert reasons["varlen"] == (
        'no varlen entry point: add varlen = "package.module:function" to [tool.attn-gate.kernels.mykernel]'
    )
    assert reasons["kvcache"].startswith("no kvcache entry point")


def test_the_family_as_a_whole_lacks_varlen_and_decode_without_their_entry_points(tmp_path):
    """What a family's capabilities say agrees with its per-case answers: the selftest moves a
    varlen-only planted bug to the gate's own kernel for a dense-only family."""
    from gate.correctness.planted import BUGS, host_of
    from gate.kernels.capabilities import Feature

    full = kernel_entry("mykernel", load_config(write_config(tmp_path))).adapter()
    dense_only = kernel_entry("mykernel", load_config(write_config(tmp_path, varlen=None, kvcache=None))).adapter()
    assert full.capabilities().supports(Feature.VARLEN) and full.capabilities().supports(Feature.KVCACHE)
    assert not dense_only.capabilities().supports(Feature.VARLEN)
    assert not dense_only.capabilities().supports(Feature.KVCACHE)
    (bug,) = [b for b in BUGS if b.name == "varlen_boundary"]
    assert host_of(bug, full) == "kernel" and host_of(bug, dense_only) == "tiled"


def test_a_bug_whose_axis_the_family_refuses_whole_is_planted_into_tiled(tmp_path):
    """A windowed one-token decode bug and a family whose decode entry takes no window (its dense
    one does, so the family as a whole claims a window): the kernel cannot have the bug in any case
    the gate runs, so the selftest shows the gate's teeth on tiled instead of failing on a gap."""
    from gate.correctness.planted import BUGS, host_of

    smoke = load_config(ROOT / "pyproject.toml").suite("smoke").cases
    (bug,) = [b for b in BUGS if b.name == "decode_window_one_short"]
    windowed = kernel_entry("mykernel", load_config(write_config(tmp_path))).adapter()
    kvcache = "tests.entry_kernels:attn_with_kvcache_no_window"
    no_window = kernel_entry("mykernel", load_config(write_config(tmp_path, kvcache=kvcache))).adapter()
    assert host_of(bug, windowed, smoke) == "kernel"
    assert host_of(bug, no_window, smoke) == "tiled"
    assert any(bug.trigger.applies(c) for c in smoke)
    # a shape the kernel refuses is a gap of the suite, not a feature it lacks: FA2 pages, but not
    # in smoke's page size of 16 (a multiple of 256 only), so its paged bug stays planted in it
    (paged,) = [b for b in BUGS if b.name == "paged_pages_swapped"]
    fa2 = get_adapter("fa2")
    assert all(fa2.unsupported_reason(c, "cuda") for c in smoke if paged.trigger.applies(c))
    assert host_of(paged, fa2, smoke) == "kernel"


def test_attn_gate_kernels_lists_the_configs_families(tmp_path, capsys):
    config = write_config(tmp_path, backward=False, kvcache=None)
    with contextlib.chdir(ROOT):
        assert main(["kernels", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mykernel        available\n")
    assert "entry points: dense, varlen; forward-only" in out


# ---------------------------------------------------------------- kernel families: the gate


def gate(config: Path, out: Path, *extra: str) -> int:
    with contextlib.chdir(ROOT):
        return main(
            [
                "check",
                "--config",
                str(config),
                "--kernel",
                "mykernel",
                "--suite",
                "entry",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out),
                *extra,
            ]
        )


def statuses(out: Path) -> dict[str, str]:
    data = json.loads((out / "sweep-mykernel-entry.json").read_text())
    return {c["case_id"]: c["status"] for c in data["cases"]}


@pytest.fixture(scope="module")
def good_family(tmp_path_factory):
    """A baseline made from the correct family, and a check of it: every entry point called."""
    tmp = tmp_path_factory.mktemp("family")
    config = write_config(tmp)
    with contextlib.chdir(ROOT):
        assert (
            main(
                [
                    "baseline",
                    "update",
                    "--config",
                    str(config),
                    "--kernel",
                    "mykernel",
                    "--suite",
                    "entry",
                    "--device",
                    "cpu",
                    "--no-progress",
                    "--out",
                    str(tmp / "update"),
                ]
            )
            == 0
        )
    # the check runs the family in a worker: its calls come back through ATTN_GATE_TEST_CALLS
    log = tmp / "calls.txt"
    log.write_text("")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTN_GATE_TEST_CALLS", str(log))
        rc = gate(config, tmp / "good")
    calls = dict(Counter(log.read_text().split()))
    return tmp, rc, calls


@pytest.mark.slow
@pytest.mark.xdist_group("entry_points")
def test_check_calls_every_entry_point_of_a_family_and_passes(good_family):
    tmp, rc, calls = good_family
    assert rc == 0
    suite = load_suite("entry", load_config(write_config(tmp)).suites)
    counts = {e: sum(1 for c in suite.cases if c.entry_point == e) for e in ("dense", "varlen", "kvcache")}
    # one call per case and seed for varlen (the packed batch in ONE call) and kvcache; dense: forward
    # once per case and seed as well (the backward goes through autograd, not another call)
    assert calls == counts, (calls, counts)
    assert set(statuses(tmp / "good").values()) == {"PASS"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "entries, bad",
    [
        (dict(varlen="tests.entry_kernels:attn_varlen_func_overread"), "varlen"),
        (dict(kvcache="tests.entry_kernels:attn_with_kvcache_contiguous"), "shuffled"),
        (dict(kvcache="tests.entry_kernels:attn_with_kvcache_no_append"), "append"),
        (dict(dense="tests.entry_kernels:attn_func_ignores_sink"), "sinks"),
    ],
    ids=["varlen over-read", "paged: contiguous pages assumed", "no append", "sink ignored"],
)
@pytest.mark.xdist_group("entry_points")
def test_a_bug_in_one_entry_point_fails_the_gate_while_the_other_paths_pass(good_family, tmp_path, entries, bad):
    tmp = good_family[0]
    config = write_config(tmp, **entries)
    assert gate(config, tmp_path / "all") == 1
    got = statuses(tmp_path / "all")
    failed = {cid for cid, status in got.items() if status == "FAIL"}
    assert failed and all(bad in cid for cid in failed), failed
    if bad == "sinks":
        assert all(c.endswith("sinks") for c in failed) and not any("kv" in c for c in failed)
    # the rest of the family alone (what a dense-only gate would have seen) passes
    others = "^(?!.*(" + ("varlen" if bad == "varlen" else "kv" if bad != "sinks" else "sinks") + "))"
    assert gate(config, tmp_path / "rest", "--only", others) == 0


@pytest.mark.slow
@pytest.mark.xdist_group("entry_points")
def test_the_cache_check_names_what_was_not_written(good_family, tmp_path):
    tmp = good_family[0]
    config = write_config(tmp, kvcache="tests.entry_kernels:attn_with_kvcache_no_append")
    gate(config, tmp_path)
    data = json.loads((tmp_path / "sweep-mykernel-entry.json").read_text())
    row = next(c for c in data["cases"] if c["case_id"].endswith("-append") and c["status"] == "FAIL")
    assert "k_cache error" in row["reason"] and "v_cache error" in row["reason"]
    assert row["tensors"]["out"]["ratio"] <= 1  # the attention itself was right: only the cache is wrong


@pytest.mark.slow
def test_a_forward_only_family_is_judged_on_out_and_lse_and_says_so(tmp_path):
    config = write_config(tmp_path, backward=False)
    with contextlib.chdir(ROOT):
        assert (
            main(
                [
                    "sweep",
                    "--config",
                    str(config),
                    "--kernel",
                    "mykernel",
                    "--suite",
                    "entry",
                    "--device",
                    "cpu",
                    "--no-progress",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
    data = json.loads((tmp_path / "sweep-mykernel-entry.json").read_text())
    for row in data["cases"]:
        assert row["forward_only"] is True and row["status"] == "PASS"
        assert {"out", "lse"} <= set(row["tensors"]) and not {"dq", "dk", "dv"} & set(row["tensors"])
        assert row["reason"].startswith("forward-only: judged on out, lse")
    assert any("forward-only kernel (backward = false)" in n for n in data["notes"])
    note = (tmp_path / "validation-mykernel-entry.md").read_text()
    assert "Forward-only rows" in note
    # a forward-only kernel with a wrong forward still fails
    bad = write_config(tmp_path, backward=False, varlen="tests.entry_kernels:attn_varlen_func_overread")
    with contextlib.chdir(ROOT):
        assert (
            main(
                [
                    "sweep",
                    "--config",
                    str(bad),
                    "--kernel",
                    "mykernel",
                    "--suite",
                    "entry",
                    "--device",
                    "cpu",
                    "--only",
                    "varlen",
                    "--no-progress",
                    "--out",
                    str(tmp_path / "bad"),
                ]
            )
            == 1
        )


def test_a_pass_without_gradients_is_complete_only_for_a_forward_only_row():
    assert rule_incomplete_pass("c", "PASS", {"out", "lse"}, required_tensors(False, forward_only=True)) is None
    finding = rule_incomplete_pass("c", "PASS", {"out", "lse"})
    assert finding is not None and "PASS without dq, dk, dv" in finding.message


# ---------------------------------------------------------------- speed


def test_a_decode_perf_case_is_timed_forward_only_with_its_kv_bandwidth():
    from gate.speed.runs import measure_case
    from gate.speed.timing import TimingPlan

    case = Case.build(**{**DECODE, "perf": True}, page_size=16)
    plan = TimingPlan(rounds=3, calls_per_round=1, warmup_s=0.0, cold_l2=False)
    result = measure_case(get_adapter("tiled"), "sdpa-math", case, "cpu", plan)
    assert result.label == "OK", result.reason
    assert result.pass_timing("bwd") is None and result.timing.plan.passes == ("fwd",)
    gbps = result.summary()["fwd"]["candidate_kv_gbps"]
    assert math.isfinite(gbps) and gbps > 0
    assert gbps == pytest.approx(case.kv_bytes() / (result.pass_timing("fwd").candidate_median_ms * 1e-3) / 1e9)


def test_the_pr_tier_times_decode_and_varlen():
    perf = load_suite("pr").perf_cases
    assert any(c.entry.kind == "kvcache" and c.entry.page_size for c in perf)
    assert any(c.entry.kind == "kvcache" and not c.entry.page_size for c in perf)
    assert any(c.entry.varlen is not None for c in perf)


def test_drift_trains_a_family_through_its_dense_entry_point_and_refuses_a_forward_only_one(tmp_path, capsys):
    entry_kernels.CALLS.clear()
    with contextlib.chdir(ROOT):
        assert (
            main(
                [
                    "drift",
                    "--kernel",
                    "mykernel",
                    "--config",
                    str(write_config(tmp_path)),
                    "--device",
                    "cpu",
                    "--steps",
                    "3",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
        assert entry_kernels.CALLS["dense"] > 0
        assert (
            main(
                [
                    "drift",
                    "--kernel",
                    "mykernel",
                    "--config",
                    str(write_config(tmp_path, backward=False)),
                    "--device",
                    "cpu",
                    "--steps",
                    "3",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 2
        )
    assert "a forward-only family (backward = false) cannot be trained" in capsys.readouterr().err


# ---------------------------------------------------------------- merged with main: coverage, selftest, ux and bias


@pytest.mark.parametrize("changes", [dict(layout="k_sliced"), dict(inputs="large"), dict(bias="dense")])
def test_a_decode_case_takes_no_layout_inputs_or_bias(changes):
    with pytest.raises(ValueError, match="a kvcache case takes no layout, inputs or bias"):
        Case.build(**DECODE, **changes)


def test_tiled_judges_sinks_and_a_learnable_bias_together():
    """Sinks and a bias in one case: the reference adds both, tiled's backward returns dsink and dbias."""
    from gate.kernels.tiled import TiledAdapter

    case = Case.build(
        batch=2,
        seqlen_q=40,
        seqlen_k=56,
        heads_q=4,
        heads_kv=2,
        head_dim=32,
        head_dim_v=32,
        dtype="fp32",
        causal=True,
        sinks=True,
        bias="dense",
        bias_grad=True,
        seeds=(0,),
    )
    row = run_case(TiledAdapter(), case, "cpu", TOL)
    assert row.status is Status.PASS, row.reason
    assert {"out", "lse", "dq", "dk", "dv", "dbias", "dsink"} <= {t.tensor for t in row.tensors}


def test_a_family_varlen_entry_gets_the_keys_own_cu_seqlens_with_sinks(tmp_path):
    """varlen_k through a family's varlen entry point (cu_seqlens_k, max_seqlen_k), with sinks."""
    adapter = kernel_entry("mykernel", load_config(write_config(tmp_path))).adapter()
    case = Case.build(
        batch=4,
        seqlen_q=40,
        seqlen_k=50,
        heads_q=4,
        heads_kv=2,
        head_dim=32,
        head_dim_v=32,
        dtype="bf16",
        causal=True,
        varlen=(5, 40, 0, 30),
        varlen_k=(50, 3, 7, 30),
        sinks=True,
        seeds=(0,),
    )
    row = run_case(adapter, case, "cpu", TOL)
    assert row.status is Status.PASS, row.reason
    assert row.tensor("dsink") is not None


def test_validation_knows_the_configs_families(tmp_path):
    """validates --kernel before anything runs: a family of the config is a known kernel; a typo of it is named."""
    from gate.workflow.validate import check_kernel

    config = load_config(write_config(tmp_path))
    check_kernel("mykernel", "cpu", config=config)
    with pytest.raises(UserError, match="did you mean mykernel"):
        check_kernel("mykernal", "cpu", config=config)


def test_the_selftests_paged_bug_is_active_and_fails_a_paged_case_only():
    """The planted `paged_pages_swapped` reads call.cache.block_table: a paged case fails, the
    unplanted kernel passes it, and the bug is not pending."""
    from gate.correctness.planted import BUGS, planted_adapter
    from gate.kernels.tiled import TiledAdapter

    bug = next(b for b in BUGS if b.name == "paged_pages_swapped")
    assert not bug.trigger.pending
    case = Case.build(**DECODE, page_size=16, shuffled_pages=True, seeds=(0,))
    assert bug.trigger.applies(case) and not bug.trigger.applies(Case.build(**DECODE))
    assert run_case(TiledAdapter(), case, "cpu", TOL).status is Status.PASS
    row = run_case(planted_adapter(bug, TiledAdapter()), case, "cpu", TOL)
    assert row.status is Status.FAIL, row.reason


# ---------------------------------------------------------------- kernel families: knobs

KNOB_SUITE = """
[tool.attn-gate.suites.knobs]
seeds = [0]

[[tool.attn-gate.suites.knobs.matrix]]
entry = ["kvcache"]
seqlens = ["3x80"]
heads = ["4/2"]
head_dims = ["32"]
cache_seqlens = [[9, 60]]
cache_new = [true]
page_size = [0, 16]
causal = [true]
knobs = [{num_splits = 3, pack_gqa = false}, {kv_layout = "HND"}]
"""


def knob_family(tmp_path: Path, kvcache: str, supports: str) -> tuple:
    """(adapter, the knob suite's cases) of a family whose kvcache entry is `kvcache`."""
    path = tmp_path / f"knobs-{len(list(tmp_path.glob('knobs-*')))}.toml"
    table = f'[tool.attn-gate.kernels.mykernel]\nkvcache = "tests.entry_kernels:{kvcache}"\nbackward = false\n'
    path.write_text(
        table + (f"[tool.attn-gate.kernels.mykernel.supports]\n{supports}\n" if supports else "") + KNOB_SUITE
    )
    config = load_config(path)
    return kernel_entry("mykernel", config).adapter(), load_suite("knobs", config.suites).cases


def test_a_family_exposes_a_knob_only_by_declaring_it(tmp_path):
    adapter, cases = knob_family(tmp_path, "attn_with_kvcache_knobs", "")
    table = "[tool.attn-gate.kernels.mykernel.supports]"
    for case in cases:
        why = adapter.unsupported_reason(case, "cpu")
        knob = "hnd_cache" if case.knobs.kv_layout == "HND" else "num_splits"
        keyword = "kv_layout" if knob == "hnd_cache" else "num_splits"
        assert why.startswith("no HND cache layout" if knob == "hnd_cache" else "no num_splits knob"), why
        assert why.endswith(f"declare {knob} = true in {table} if its kvcache entry takes {keyword}="), why
    # declared, on a function that takes no such keyword: the signature wins, and the SKIP says so
    adapter, cases = knob_family(tmp_path, "attn_with_kvcache", "num_splits = true\npack_gqa = true\nhnd_cache = true")
    for case in cases:
        why = adapter.unsupported_reason(case, "cpu")
        assert "= true in [tool.attn-gate.kernels.mykernel.supports], but the signature of" in why, why


def test_declared_knobs_reach_the_function_and_an_hnd_cache_is_judged_through_its_layout(tmp_path):
    declared = "num_splits = true\npack_gqa = true\nhnd_cache = true"
    adapter, cases = knob_family(tmp_path, "attn_with_kvcache_knobs", declared)
    entry_kernels.KNOBS_SEEN.clear()
    for case in cases:
        result = run_case(adapter, case, "cpu", TOL)
        assert result.status is Status.PASS, (case.id, result.reason)
    forced = [dict(num_splits=3, pack_gqa=False, kv_layout="NHD"), dict(num_splits=0, pack_gqa=None, kv_layout="HND")]
    assert entry_kernels.KNOBS_SEEN == forced * 2  # contiguous, then paged
    # the same family reading the HND cache as if it were NHD fails those cases, and only those
    adapter, cases = knob_family(tmp_path, "attn_with_kvcache_knobs_hnd_as_nhd", declared)
    got = {c.id: run_case(adapter, c, "cpu", TOL).status for c in cases}
    assert {cid: s for cid, s in got.items() if s is not Status.PASS} == {
        cid: Status.FAIL for cid in got if cid.endswith("-hnd")
    }
