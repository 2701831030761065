"""The coverage axes of every axis is in the smoke suite in a small form, a bug of its
class planted in a user kernel (tests/coverage_kernels.py) makes `attn-gate check` fail on that
axis's cases and pass the cases the suites had before, and the correct kernel passes them all; the
varlen combinations (softcap, window) and seqused_k, whose bugs live in a varlen entry point, likewise
through a kernel family (tests/entry_kernels.py).
Also: layouts really hand the kernel views, the pairwise cover, the tiers' sizes, and the LSE
yardstick (a 1e-3 bias fails a bf16 case by the rule alone; correct CPU kernels keep margin)."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import types
from pathlib import Path

import pytest
import torch

from gate.attention.inputs import FP8_TORCH_DTYPES, kernel_tensors, make_inputs
from gate.commands.main import main
from gate.core.cases import Case, expand_block, load_suite, pairwise_points
from gate.core.config import ToleranceConfig
from gate.core.errors import UserError
from gate.core.results import Status
from gate.correctness.run_case import run_case, run_kernel
from gate.kernels.registry import get_adapter
from gate.kernels.user import UserAdapter

ROOT = Path(__file__).resolve().parent.parent
TOL = ToleranceConfig()
SMOKE = load_suite("smoke")
NEW_AXES = ("layout", "inputs", "varlen_k")

# bug -> (regex of the smoke cases of its axis that must FAIL the check, one smoke case without the axis that it passes)
PLANTED = {
    "assumes_contiguous": (r"-(k_sliced|qkv_packed|bhsd_view)$", "bf16-b2-h4/1-s97x257-d64-causal"),
    "dout_assumed_contiguous": (r"-dout_noncontig$", "bf16-b2-h4/1-s97x257-d64-causal"),
    "zero_stride_as_dense": (r"-kv_stride0$", "bf16-b2-h4/2-s70x90-d40-k_sliced"),
    "no_max_subtraction": (r"-d64(-causal)?-(large|shifted)$", "bf16-b2-h4-s128-d64"),
    "ignores_softcap": (r"-cap20-large$", "bf16-b2-h4-s128-d64-causal"),
    "v_saturates_at_16": (r"-outliers$", "bf16-b2-h4/2-s200-d64-win16.16"),
    "dq_head_dim_tail_dropped": (r"^bf16-b2-h2-s33x65-d(59|72|111)$", "bf16-b2-h4-s128-d64-causal"),
    "scale_from_dv": (r"-d(192|144|160)/128$|-d128/96$", "bf16-b2-h2-s33x65-d256"),
    "causal_top_left": (
        r"^fp16-b2-h2-s(1x339|239x1|113x203)-d32-causal$|-causal-varlen5\.40\.0\.30x",
        "bf16-b2-h4-s128-d64-causal",
    ),
    "key_tile_floor": (r"^fp16-b2-h2-s129-d32(-causal)?$", "bf16-b2-h4-s128-d64-causal"),
    "window_ignored_when_causal": (r"-causal-win(32\.0|16\.-1)$", "bf16-b2-h4/2-s200-d64-win32.0"),
    "window_minus_one_ignored": (r"^bf16-b2-h2-s96x128-d32-win-1\.0$", "bf16-b2-h4/2-s200-d64-win32.0"),
    "alibi_causal_only": (
        r"^bf16-b2-h4-s80x100-d32-(win24\.24-)?(cap20-)?alibi$",
        "bf16-b2-h2-s150x90-d64-causal-cap20-alibi",
    ),
    "pack_gqa_decode_wrong": (r"-h8/(2|4)-s1x300-d64$", "bf16-b2-h4/1-s1-d64-causal"),
    "ignores_descale": (r"^e(4m3|5m2)-", "bf16-b2-h4/1-s97x257-d64-causal"),
    "descale_of_first_head": (r"^e(4m3|5m2)-", "bf16-b2-h4/1-s97x257-d64-causal"),
    "offsets_int32": (r"-far_rows$", "bf16-b2-h4/2-s70x90-d40-k_sliced"),
    # rows of one element addressed in 64 bits: the batch-1 and varlen far_rows cases pass it
    "batch_offsets_int32": (r"-far_batch$", "bf16-b1-h4/2-s33x65-d32-causal-far_rows"),
}


def _check(baseline: Path, kernel: str, only: str, out: Path) -> tuple[int, dict]:
    with contextlib.chdir(ROOT):
        rc = main(
            [
                "check",
                "--kernel",
                f"tests.coverage_kernels:{kernel}",
                "--baseline",
                str(baseline),
                f"--only={only}",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
    stem = f"tests.coverage_kernels_{kernel}-smoke"
    return rc, json.loads((out / f"findings-{stem}.json").read_text())


def _smoke_ids(pattern: str) -> list[str]:
    return [c.id for c in SMOKE.cases if re.search(pattern, c.id)]


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


# ---------------------------------------------------------------- the axes in smoke, and their bugs


def test_smoke_carries_every_new_axis_value():
    layouts = {c.layout for c in SMOKE.cases}
    inputs = {c.inputs for c in SMOKE.cases}
    assert layouts == {
        "contiguous",
        "k_sliced",
        "qkv_packed",
        "bhsd_view",
        "dout_noncontig",
        "kv_stride0",
        "far_rows",
        "far_batch",
    }
    # far_rows and far_batch in bf16/fp16 only: their buffers are the size of 2**31 elements (virtual on a CPU)
    assert {c.layout for c in SMOKE.cases if c.dtype == "fp32"} >= set(layouts) - {
        "contiguous",
        "far_rows",
        "far_batch",
    }
    assert any(c.layout == "far_rows" and c.entry.varlen for c in SMOKE.cases)
    assert any(c.layout == "kv_stride0" and c.entry.varlen for c in SMOKE.cases)
    assert inputs == {"normal", "large", "shifted", "outliers"}
    assert any(c.entry.varlen_k is not None for c in SMOKE.cases)
    assert {c.head_dim for c in SMOKE.cases} >= {59, 72, 111, 192, 144, 160, 256}
    assert {(c.head_dim, c.head_dim_v) for c in SMOKE.cases} >= {(144, 128), (160, 128), (128, 96), (256, 256)}
    assert any(c.head_dim_v != c.head_dim for c in SMOKE.cases if c.dtype != "fp32")
    assert any(c.causal and c.has_window for c in SMOKE.cases) and any(
        not c.causal and c.window == (-1, 0) for c in SMOKE.cases
    )
    assert any(c.alibi and not c.causal for c in SMOKE.cases) and any(c.alibi and c.has_window for c in SMOKE.cases)
    assert any(c.softcap and not c.causal for c in SMOKE.cases)
    assert any(c.softcap and c.entry.varlen for c in SMOKE.cases) and any(
        c.has_window and c.entry.varlen for c in SMOKE.cases
    )
    assert {c.heads_kv for c in SMOKE.cases if c.seqlen_q == 1 and c.seqlen_k > 1} >= {1, 2, 4}
    assert {c.dtype for c in SMOKE.cases if c.is_fp8} == {"e4m3", "e5m2"}


@pytest.mark.slow
def test_correct_kernel_passes_every_coverage_case(cpu_baseline, tmp_path):
    ids = [c.id for c in SMOKE.cases if c.layout != "contiguous" or c.inputs != "normal" or c.entry.varlen_k]
    rc, findings = _check(
        cpu_baseline.path,
        "correct",
        "|".join(f"^{re.escape(i)}$" for i in ids)
        + "|d(59|72|111|192|144|160|256)|d128/96|1x300|129|239x1|1x339|113x203"
        "|96x128|80x100|varlen1\\.40|^e4m3-|^e5m2-",
        tmp_path,
    )
    assert rc == 0 and findings["verdict"] == "PASS", [
        f["message"] for f in findings["findings"] if f["severity"] == "FAIL"
    ]
    sweep = json.loads((tmp_path / "sweep-tests.coverage_kernels_correct-smoke.json").read_text())
    statuses = [c["status"] for c in sweep["cases"]]
    assert len(statuses) >= 40 and set(statuses) == {"PASS"}  # every coverage case measured, none skipped


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_check_on_its_axis_and_passes_without_it(cpu_baseline, bug, tmp_path):
    pattern, control = PLANTED[bug]
    targets = _smoke_ids(pattern)
    assert targets, f"no smoke case matches {pattern}"
    rc, findings = _check(cpu_baseline.path, bug, pattern, tmp_path)
    assert rc == 1 and findings["verdict"] == "FAIL"
    failed = {
        f["case_id"] for f in findings["findings"] if f["severity"] == "FAIL" and f["rule"] in ("tolerance", "status")
    }
    assert failed == set(targets), (bug, sorted(set(targets) - failed))
    # the same bug passes a case without its axis
    case = next(c for c in SMOKE.cases if c.id == control)
    result = run_case(get_adapter(f"tests.coverage_kernels:{bug}"), case, "cpu", TOL)
    assert result.status is Status.PASS, (bug, control, result.reason)


# Bugs that live in a kernel's varlen entry point alone (flash_attn_varlen_func convention, one call for the
# packed batch: tests/entry_kernels.py), planted in a family whose dense entry point is right. The CPU
# cases of the combination each must FAIL; every other varlen case of smoke (ALiBi and custom bias
# aside: these entry points take neither) and the dense softcap/window cases (the right dense entry point) must
# PASS, as the correct varlen entry point passes them all.
VARLEN_CASES = r"^(?!.*alibi)(?!.*-bias\.).*-varlen"
DENSE_CONTROLS = r"^(?!.*alibi)(?!.*varlen)(?!.*-kv\d).*-(cap20|win16\.)"
VARLEN_PLANTED = {
    "attn_varlen_func_softcap_ignored": r"-cap20-varlen",  # softcap x varlen, forward and backward
    "attn_varlen_func_softcap_backward_dropped": r"-cap20-varlen",  # only the backward: flash-attention PR #2544
    "attn_varlen_func_window_unclamped": r"-win16\.0-varlen",  # window x varlen: the band crosses sequence starts
    "attn_varlen_func_seqused_off_by_one": VARLEN_CASES,  # seqused_k, handed where the entry point takes it
}


def _family_check(baseline: Path, varlen_entry: str, tmp_path: Path) -> tuple[int, dict[str, str]]:
    config = tmp_path / "pyproject.toml"
    config.write_text(
        '[tool.attn-gate.kernels.cov]\ndense = "tests.entry_kernels:attn_func"\n'
        f'varlen = "tests.entry_kernels:{varlen_entry}"\n'
    )
    with contextlib.chdir(ROOT):
        rc = main(
            [
                "check",
                "--config",
                str(config),
                "--kernel",
                "cov",
                "--suite",
                "smoke",
                "--baseline",
                str(baseline),
                f"--only={VARLEN_CASES}|{DENSE_CONTROLS}",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    sweep = json.loads((tmp_path / "out" / "sweep-cov-smoke.json").read_text())
    return rc, {c["case_id"]: c["status"] for c in sweep["cases"]}


@pytest.mark.slow
def test_correct_varlen_entry_point_passes_every_varlen_case(cpu_baseline, tmp_path):
    rc, statuses = _family_check(cpu_baseline.path, "attn_varlen_func", tmp_path)
    assert rc == 0 and set(statuses.values()) == {"PASS"}, statuses
    assert sum("-varlen" in i for i in statuses) >= 9 and sum("-varlen" not in i for i in statuses) >= 3, statuses


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(VARLEN_PLANTED))
def test_planted_varlen_bug_fails_exactly_its_combination(cpu_baseline, bug, tmp_path):
    rc, statuses = _family_check(cpu_baseline.path, bug, tmp_path)
    targets = {i for i in statuses if re.search(VARLEN_PLANTED[bug], i)}
    assert targets and rc == 1
    assert {i for i, s in statuses.items() if s == "FAIL"} == targets, statuses
    assert all(statuses[i] == "PASS" for i in set(statuses) - targets), statuses


# ---------------------------------------------------------------- layouts are views, not copies


@pytest.mark.parametrize(
    "layout, varlen",
    [
        (layout, varlen)
        for layout in ("k_sliced", "qkv_packed", "bhsd_view", "dout_noncontig", "kv_stride0", "far_rows", "far_batch")
        for varlen in (False, True)
        if not (layout == "far_batch" and varlen)  # a dense layout: a varlen batch is packed rows (far_rows)
    ],
)
def test_layout_hands_the_kernel_a_view_with_the_same_values(layout, varlen):
    kw = (
        dict(varlen=(3, 0, 17), batch=3, seqlen_q=17, seqlen_k=17) if varlen else dict(batch=2, seqlen_q=9, seqlen_k=13)
    )
    case = Case.build(heads_q=4, heads_kv=2, head_dim=24, head_dim_v=16, dtype="bf16", layout=layout, seeds=(0,), **kw)
    inputs = make_inputs(case, 0, "cpu")
    t = kernel_tensors(case, inputs)
    for got, want in zip((t.q, t.k, t.v, t.dout), (inputs.q, inputs.k, inputs.v, inputs.dout)):
        assert torch.equal(got.detach(), want) and got.shape == want.shape
    moved = {
        "k_sliced": (t.k,),
        "qkv_packed": (t.q, t.k, t.v),
        "bhsd_view": (t.q, t.k, t.v),
        "dout_noncontig": (t.dout,),
        "kv_stride0": (t.k, t.v),
        "far_rows": (t.q, t.k, t.v, t.dout),
        "far_batch": (t.q, t.k, t.v, t.dout),
    }[layout]
    assert all(not x.is_contiguous() for x in moved)
    if layout == "qkv_packed":
        assert t.q.untyped_storage().data_ptr() == t.k.untyped_storage().data_ptr() == t.v.untyped_storage().data_ptr()
    if layout == "k_sliced":
        assert t.k.storage_offset() > 0
    if layout == "far_rows":  # the last quarter of every tensor's rows start past 2**31 elements
        for x in (t.q, t.k, t.v, t.dout):
            rows = x.shape[0] * (1 if varlen else x.shape[1])
            starts = [r * x.stride(-3) for r in range(rows)]
            assert sum(o >= 2**31 for o in starts) >= rows // 4 and starts[rows // 2] < 2**31
    if layout == "far_batch":  # the last batch element starts past 2**31 elements; within one, dense
        for x in (t.q, t.k, t.v, t.dout):
            assert (x.shape[0] - 1) * x.stride(0) >= 2**31 and x[0].is_contiguous()
    if layout == "kv_stride0":  # 0 over the KV heads (and the batch, dense); the buffer holds more than the view
        assert t.k.stride(-2) == t.v.stride(-2) == 0 and (varlen or t.k.stride(0) == 0)
        assert t.k.untyped_storage().nbytes() == inputs.k.numel() * inputs.k.element_size()
    seen = {}

    def spy(q, k, v, softmax_scale=None):
        seen.update(q=q, k=k, v=v)
        return (
            (
                torch.softmax(
                    q.float().transpose(1, 2)
                    @ k.float().transpose(1, 2).repeat_interleave(2, 1).transpose(-1, -2)
                    * softmax_scale,
                    -1,
                )
                @ v.float().transpose(1, 2).repeat_interleave(2, 1)
            )
            .transpose(1, 2)
            .to(q.dtype)
        )

    import tests.coverage_kernels as mod

    mod._spy = spy
    try:
        adapter = get_adapter("tests.coverage_kernels:_spy")
        _, grads = run_kernel(adapter, case, inputs)
    finally:
        del mod._spy
    if layout != "dout_noncontig":
        name = "k" if layout in ("k_sliced", "kv_stride0") else "q"
        assert not seen[name].is_contiguous()  # the kernel got the view itself (varlen: a slice of it)
    assert [g.shape for g in grads] == [inputs.q.shape, inputs.k.shape, inputs.v.shape]


# ---------------------------------------------------------------- ids, defaults, validation


def test_new_fields_default_out_of_ids_and_hashes():
    plain = Case.build(batch=2, seqlen_q=8, seqlen_k=8, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16")
    assert (
        "layout" not in plain.hash_dict() and "inputs" not in plain.hash_dict() and "varlen_k" not in plain.hash_dict()
    )
    assert plain.id == "bf16-b2-h2-s8-d16"
    fancy = Case.build(
        batch=2,
        seqlen_q=5,
        seqlen_k=9,
        heads_q=2,
        heads_kv=2,
        head_dim=16,
        head_dim_v=16,
        dtype="bf16",
        varlen=(5, 0),
        varlen_k=(9, 2),
        layout="bhsd_view",
        inputs="shifted",
    )
    assert fancy.id.endswith("-varlen5.0x9.2-bhsd_view-shifted")
    assert Case.from_dict(fancy.to_dict()) == fancy


@pytest.mark.parametrize(
    "kw",
    [
        dict(layout="nope"),
        dict(inputs="huge"),
        dict(varlen_k=(4,)),
        dict(varlen=(3, 2), batch=2, seqlen_q=3, seqlen_k=3, varlen_k=(0, 3)),
    ],
)
def test_bad_new_fields_are_refused(kw):
    base = dict(batch=2, seqlen_q=4, seqlen_k=4, heads_q=2, heads_kv=2, head_dim=8, head_dim_v=8, dtype="bf16")
    with pytest.raises(ValueError):
        Case.build(**{**base, **kw})


def test_suite_toml_errors_name_the_axis():
    with pytest.raises(UserError, match="layout"):
        expand_block({"layout": ["diagonal"]}, (0,), "x")
    with pytest.raises(UserError, match="pairwise"):
        expand_block({"pairwise": "yes"}, (0,), "x")
    with pytest.raises(UserError, match="varlen_k"):
        expand_block({"varlen_k": [[3, 4]]}, (0,), "x")
    with pytest.raises(UserError, match="seeds"):
        expand_block({"seeds": []}, (0,), "x")


def test_a_block_may_run_fewer_seeds_than_its_suite():
    assert {c.seeds for c in expand_block({"seeds": [0]}, (0, 1), "x")} == {(0,)}
    assert {c.seeds for c in expand_block({}, (0, 1), "x")} == {(0, 1)}
    pr = load_suite("pr")
    assert {len(c.seeds) for c in pr.cases if c.perf} == {2}  # the timed shapes keep two seeds
    assert sum(len(c.seeds) for c in pr.cases) < 1.3 * len(pr.cases)  # breadth blocks: one seed


@pytest.mark.parametrize("sizes", [[3, 3, 3, 3], [6, 5, 4, 3, 2, 2, 2, 5], [2], [4, 1, 3]])
def test_pairwise_covers_every_pair_with_fewer_rows_than_the_product(sizes):
    rows = pairwise_points(sizes)
    for a, b in itertools.combinations(range(len(sizes)), 2):
        assert {(r[a], r[b]) for r in rows} == set(itertools.product(range(sizes[a]), range(sizes[b])))
    product = 1
    for s in sizes:
        product *= s
    assert len(rows) <= product and (len(sizes) < 4 or len(rows) < product / 4)
    assert pairwise_points(sizes) == rows  # deterministic: suite hashes must not move


# ---------------------------------------------------------------- tiers


def test_tiers_have_their_sizes_and_every_axis():
    pr, nightly = load_suite("pr"), load_suite("nightly")
    assert len(pr.cases) >= 300 and len(pr.perf_cases) >= 24
    layouts = {"contiguous", "k_sliced", "qkv_packed", "bhsd_view", "dout_noncontig"}
    # pr's: the stride-0 x mask x d512 crossing, and batch offsets past 2^31 (GPU buffers, no reference cost)
    assert {c.layout for c in pr.cases} == layouts | {"kv_stride0", "far_batch"}
    assert all(c.batch >= 2 and not c.entry.varlen for c in pr.cases if c.layout == "far_batch")
    stride0 = [c for c in pr.cases if c.layout == "kv_stride0"]
    assert {c.head_dim for c in stride0} == {256, 512} and all(
        c.seqlen_k % 32 == 1 and c.bias.kind == "bool_mask" for c in stride0
    )
    assert {c.layout for c in nightly.cases} == layouts | {"kv_stride0", "far_rows"}  # the round-2 layouts
    for suite in (pr, nightly):
        assert {c.inputs for c in suite.cases} == {"normal", "large", "shifted", "outliers"}
        assert any(c.entry.varlen_k for c in suite.cases)
    perf = pr.perf_cases
    assert {c.head_dim for c in perf} >= {64, 128, 256} and {c.dtype for c in perf} == {"bf16", "fp16"}
    assert any(c.causal for c in perf) and any(not c.causal for c in perf) and any(c.is_gqa for c in perf)
    assert any(c.seqlen_q == 1 and c.seqlen_k >= 8192 for c in perf) and any(c.entry.varlen for c in perf)
    assert {512, 2048, 8192, 16384} <= {c.seqlen_k for c in perf}
    assert {65537, 131072} <= {c.seqlen_k for c in nightly.cases}
    assert max(c.seqlen_k for c in pr.cases if c.seqlen_q > 1) <= 16384  # a pr case's attention stays small
    decode = {(c.batch, c.seqlen_k, c.entry.page_size) for c in perf if c.entry.kind == "kvcache"}
    assert {(64, 8192, 0), (64, 8192, 256), (1, 32768, 256)} <= decode  # the serving sizes' decode speed
    nightly_decode = {(c.batch, c.seqlen_k, c.entry.page_size) for c in nightly.perf_cases if c.entry.kind == "kvcache"}
    assert {
        (b, s, p) for b, s in ((64, 2048), (64, 8192), (1, 32768)) for p in (0, 256)
    } <= nightly_decode  # the nightly's
    round2 = [
        c for c in nightly.cases if c.is_fp8 or c.head_dim != c.head_dim_v or c.layout in ("kv_stride0", "far_rows")
    ]
    assert {c.dtype for c in round2} >= {"e4m3", "e5m2"} and {(c.head_dim, c.head_dim_v) for c in round2} >= {
        (144, 128),
        (160, 128),
        (128, 96),
    }


# ---------------------------------------------------------------- the LSE yardstick


def _lse_case(**kw):
    base = dict(
        batch=2,
        seqlen_q=128,
        seqlen_k=128,
        heads_q=4,
        heads_kv=4,
        head_dim=64,
        head_dim_v=64,
        dtype="bf16",
        seeds=(0, 1),
    )
    return Case.build(**{**base, **kw})


@pytest.mark.parametrize(
    "case",
    [_lse_case(), _lse_case(causal=True), _lse_case(dtype="fp16", seqlen_q=97, seqlen_k=257)],
    ids=["bf16", "bf16-causal", "fp16-skewed"],
)
def test_lse_bias_of_1e_3_fails_by_the_rule_alone(case):
    result = run_case(get_adapter("tests.coverage_kernels:lse_bias_1e_3"), case, "cpu", TOL)
    assert result.status is Status.FAIL and "lse error" in result.reason
    lse = next(t for t in result.tensors if t.tensor == "lse")
    assert lse.ratio > 2.0 and lse.bound < 5e-4, lse
    assert all(t.passed for t in result.tensors if t.tensor != "lse")


@pytest.mark.parametrize("kernel", ["sdpa-cpu", "tiled", "tests.coverage_kernels:correct"])
@pytest.mark.parametrize(
    "case",
    [
        _lse_case(),
        _lse_case(causal=True),
        _lse_case(inputs="shifted"),
        _lse_case(dtype="fp16", seqlen_q=97, seqlen_k=257, causal=True),
    ],
    ids=["bf16", "bf16-causal", "bf16-shifted", "fp16-skewed-causal"],
)
def test_correct_cpu_kernels_keep_lse_margin(kernel, case):
    result = run_case(get_adapter(kernel), case, "cpu", TOL)
    assert result.status is Status.PASS, result.reason
    lse = next((t for t in result.tensors if t.tensor == "lse"), None)
    if lse is None:
        assert kernel == "sdpa-cpu" and case.causal and case.seqlen_q != case.seqlen_k  # causal_lower_right: no LSE op
        return
    assert lse.ratio < 0.6, lse  # margin: a correct kernel sits well inside the bound


def test_sdpa_math_lse_not_exposed_but_passes():
    result = run_case(get_adapter("sdpa-math"), _lse_case(causal=True), "cpu", TOL)
    assert result.status is Status.PASS and "lse not exposed" in result.reason


def test_fa4_raw_window_hands_the_minus_one_spelling_to_the_kernel():
    from gate.attention.reference import AttnOptions
    from gate.kernels.base import KernelCall
    from gate.kernels.flash_attn import FA4Adapter, FA4RawWindowAdapter

    x = torch.zeros(1, 4, 1, 8)
    call = KernelCall(q=x, k=x, v=x, opts=AttnOptions(softmax_scale=1.0, causal=True, window=(-1, 0)))
    no_module = types.SimpleNamespace(flash_attn_func=None)
    assert FA4Adapter()._entry(call, no_module).options(call)["window_size"] == (None, 0)
    assert FA4RawWindowAdapter()._entry(call, no_module).options(call)["window_size"] == (-1, 0)
    assert get_adapter("fa4-raw-window").name == "fa4-raw-window"


def test_depth_probes_follow_varlen_k():
    from gate.correctness.probes.determinism import batch_invariance_check, scaled_batch

    case = Case.build(
        batch=3,
        seqlen_q=40,
        seqlen_k=9,
        heads_q=2,
        heads_kv=1,
        head_dim=16,
        head_dim_v=16,
        dtype="bf16",
        varlen=(5, 40, 0),
        varlen_k=(9, 3, 4),
        seeds=(0,),
        layout="k_sliced",
    )
    big = scaled_batch(case, 2)
    assert big.entry.varlen == (5, 40, 0) * 2 and big.entry.varlen_k == (9, 3, 4) * 2
    (inv,) = batch_invariance_check(get_adapter("tiled"), case, "cpu")
    assert inv.passed is None and "cu_seqlens_k" in inv.detail  # stated as not applicable, never a silent pass


# ---------------------------------------------------------------- fp8


def _fp8_case(dtype="e4m3", **kw):
    base = dict(
        batch=2, seqlen_q=33, seqlen_k=65, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32, dtype=dtype, seeds=(0,)
    )
    return Case.build(**{**base, **kw})


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_fp8_inputs_are_exact_dequantized_values_with_per_head_descales(dtype):
    case = _fp8_case(dtype, inputs="outliers")
    inputs = make_inputs(case, 0, "cpu")
    fp8 = inputs.fp8
    assert inputs.q.dtype == torch.bfloat16 and fp8.q.dtype == FP8_TORCH_DTYPES[dtype]
    for t8, scale, values in (
        (fp8.q, fp8.q_descale, inputs.q),
        (fp8.k, fp8.k_descale, inputs.k),
        (fp8.v, fp8.v_descale, inputs.v),
    ):
        assert scale.shape == (2, 2) and scale.dtype == torch.float32
        assert torch.equal(scale, torch.exp2(torch.log2(scale).round()))  # powers of two
        assert len(set(scale.flatten().tolist())) > 1  # one factor read for all is wrong somewhere
        group = case.heads_q // case.heads_kv if t8 is fp8.q else 1
        per_head = scale.repeat_interleave(group, dim=1).view(2, 1, -1, 1)
        assert torch.equal(t8.float() * per_head, values.float())  # the references see exactly the kernel's values
    tensors = kernel_tensors(case, inputs)
    assert tensors.q is fp8.q and not tensors.q.requires_grad


def test_fp8_cases_are_forward_only_dense_and_counted_in_bytes():
    case = _fp8_case()
    assert case.forward_only and case.compute_dtype == "bf16" and case.id == "e4m3-b2-h4/2-s33x65-d32"
    assert case.kv_bytes() == case.batch * case.seqlen_k * case.heads_kv * 64 * 1
    for kw in (dict(layout="k_sliced"), dict(varlen=(33, 20), seqlen_k=33), dict(dropout_p=0.1), dict(bias="dense")):
        with pytest.raises(ValueError, match="fp8"):
            _fp8_case(**kw)


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_fp8_dequantizing_kernel_passes_and_descale_bugs_fail(dtype):
    case = _fp8_case(dtype, causal=True, seeds=(0, 1))
    good = run_case(get_adapter("tests.coverage_kernels:correct"), case, "cpu", TOL)
    assert good.status is Status.PASS and "forward-only" in good.reason, good.reason
    assert {t.tensor for t in good.tensors} == {"out", "lse"} and max(t.ratio for t in good.tensors) < 0.5
    assert next(t for t in good.tensors if t.tensor == "out").pt_err > 1e-2  # P rounded to fp8 in the yardstick
    for bug in ("ignores_descale", "descale_of_first_head"):
        bad = run_case(get_adapter(f"tests.coverage_kernels:{bug}"), case, "cpu", TOL)
        assert bad.status is Status.FAIL and "out error" in bad.reason, (bug, bad.reason)


def test_fp8_mma_keeps_13_fraction_bits_per_32_products():
    from gate.attention.reference import fp8_mma

    one = torch.ones(1, 32)
    exact = torch.full((32, 1), 1.0 + 2.0**-13)  # 32 + 2**-8: within 13 fraction bits of 32
    assert float(fp8_mma(one, exact)) == 32.0 + 2.0**-8
    finer = torch.full((32, 1), 1.0 + 2.0**-15)  # 32 + 2**-10 needs 15 fraction bits: cut toward zero
    assert float(fp8_mma(one, finer)) == 32.0 and float(one @ finer) == 32.0 + 2.0**-10
    a, b = torch.randn(3, 5, 96), torch.randn(3, 96, 7)
    error = (fp8_mma(a, b) - a @ b).abs()
    assert (error <= 3 * 2.0**-13 * (a.abs() @ b.abs())).all() and error.max() > 0  # one cut per 32 products


def test_fp8_lse_yardstick_accumulates_scores_as_an_fp8_tensor_core():
    """Hopper's fp8 tensor cores add up Q K^T in 13 fraction bits, so an fp8 kernel's LSE is far
    from float32's (FA3 on an H200: LSE errors 0.02-0.09 nats with large inputs, ratios up to 224
    against a float32 yardstick). A kernel with that accumulator passes; an LSE 0.01 off still fails
    (at d32 the accumulator's own LSE error is about 1.5e-4, the bound 1.4e-3)."""
    from gate.attention.reference import attention_reference
    from gate.correctness.run_case import options

    case = _fp8_case("e4m3", head_dim=128, head_dim_v=128, seqlen_q=64, seqlen_k=256, causal=True, inputs="large")
    hopper = run_case(get_adapter("tests.coverage_kernels:fp22_scores"), case, "cpu", TOL)
    assert hopper.status is Status.PASS, hopper.reason
    lse = hopper.tensor("lse")
    x = make_inputs(case, 0, "cpu")
    float32 = attention_reference(x.q, x.k, x.v, x.dout, options(case, x), torch.float32, backward=False)
    gold = attention_reference(x.q, x.k, x.v, x.dout, options(case, x), torch.float64, backward=False)
    float32_bound = lse.mult * float((float32.lse.double() - gold.lse).abs().max()) + lse.floor
    assert lse.max_err > 10 * float32_bound  # what a float32 yardstick would have failed
    from tests.coverage_kernels import correct

    def lse_off(
        q,
        k,
        v,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        return_attn_probs=False,
        q_descale=None,
        k_descale=None,
        v_descale=None,
    ):
        out, lse, probs = correct(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, True, q_descale, k_descale, v_descale
        )
        return (out, lse + 0.01, probs) if return_attn_probs else out

    off = run_case(UserAdapter("lse_off", lse_off), _fp8_case("e4m3", causal=True), "cpu", TOL)
    assert off.status is Status.FAIL and "lse error" in off.reason, off.reason
    # the price of the max bound, as docs/tolerance.md states it: 1e-3 nats is within what the
    # accumulator itself errs; the same offset on every row is a bias, which the mean rule fails
    within = run_case(get_adapter("tests.coverage_kernels:lse_bias_1e_3"), _fp8_case("e4m3", causal=True), "cpu", TOL)
    lse = within.tensor("lse")
    assert lse.within_max and not lse.within_mean and within.status is Status.FAIL, within.reason


@pytest.mark.parametrize(
    "kw", [dict(batch=1, seqlen_q=3, seqlen_k=9), dict(varlen=(2, 0, 1), batch=3, seqlen_q=2, seqlen_k=2)]
)
def test_far_rows_needs_four_rows_to_put_a_quarter_past_2_31(kw):
    with pytest.raises(ValueError, match="far_rows needs at least 4"):
        Case.build(heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16", layout="far_rows", **kw)
    Case.build(
        heads_q=2,
        heads_kv=2,
        head_dim=16,
        head_dim_v=16,
        dtype="bf16",
        layout="far_rows",
        batch=2,
        seqlen_q=2,
        seqlen_k=2,
    )


def test_kernels_without_fp8_skip_with_the_reason():
    case = _fp8_case()
    for kernel in ("sdpa-cpu", "sdpa-math"):
        result = run_case(get_adapter(kernel), case, "cpu", TOL)
        assert result.status is Status.SKIP and result.reason.startswith("no e4m3: no fp8 path"), result.reason
    tiled = run_case(
        get_adapter("tiled"), case.with_fields(dtype="e5m2"), "cpu", TOL
    )  # dequantizes, then its bf16 path
    assert tiled.status is Status.PASS and max(t.ratio for t in tiled.tensors) < 0.5, tiled.reason

    def no_descale(q, k, v, softmax_scale=None, causal=False):
        raise AssertionError("never called for an fp8 case")

    result = run_case(UserAdapter("plain", no_descale), case, "cpu", TOL)
    assert result.status is Status.SKIP and "no fp8 path" in result.reason


def test_fa3_declares_e4m3_unless_built_without_and_passes_the_descales(monkeypatch):
    from gate.attention.reference import AttnOptions
    from gate.kernels import flash_attn
    from gate.kernels.base import KernelCall

    monkeypatch.setattr(flash_attn, "fa3_build_flags", lambda: {})
    assert flash_attn.FA3Adapter().capabilities().dtypes == ("fp16", "bf16", "e4m3")  # FA3 refuses e5m2
    monkeypatch.setattr(flash_attn, "fa3_build_flags", lambda: {"FLASHATTENTION_DISABLE_FP8": True})
    assert "e4m3" not in flash_attn.FA3Adapter().capabilities().dtypes
    x, scale = torch.zeros(1, 4, 2, 8), torch.ones(1, 2)
    call = KernelCall(
        q=x, k=x, v=x, opts=AttnOptions(softmax_scale=1.0, causal=False), descale=(scale, 2 * scale, 4 * scale)
    )
    kwargs = flash_attn.FA3Adapter()._entry(call, types.SimpleNamespace(flash_attn_func=None)).options(call)
    assert [float(kwargs[k][0, 0]) for k in ("q_descale", "k_descale", "v_descale")] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch=1, seqlen_q=8, seqlen_k=8),
        dict(varlen=(4, 4), batch=2, seqlen_q=4, seqlen_k=4),
        dict(batch=2, seqlen_q=1, seqlen_k=16, entry="kvcache", cache_seqlens=(3, 5)),
    ],
)
def test_far_batch_needs_a_dense_batch_of_two(kw):
    """one element has no batch offset; a varlen batch is rows (far_rows); a decode case hands a cache."""
    heads = dict(heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16", layout="far_batch")
    with pytest.raises(ValueError, match="far_batch needs a dense, non-varlen case of batch >= 2"):
        Case.build(**heads, **kw)
    case = Case.build(**heads, batch=2, seqlen_q=8, seqlen_k=8)
    assert case.id.endswith("-far_batch")
    three = kernel_tensors(case.with_fields(batch=3), make_inputs(case.with_fields(batch=3), 0, "cpu"))
    for x in (three.q, three.k, three.v, three.dout):  # only the last element starts past 2**31
        assert [b * x.stride(0) >= 2**31 for b in range(3)] == [False, False, True]
