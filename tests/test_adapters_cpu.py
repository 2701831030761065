"""Adapters on the CPU: what they cannot run is SKIPPED with a reason; tiled, sdpa-cpu and
sdpa-math agree with the reference on every axis they claim; broken kernels become ERROR/FAIL
rows; GPU-only kernels are reported as unavailable, never a crash."""

from __future__ import annotations

import shutil

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.commands.main import main
from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.core.results import Status
from gate.correctness.run_case import leaf_call, references, run_case
from gate.kernels.base import Capabilities, KernelAdapter, KernelOutput
from gate.kernels.capabilities import Feature, feature_set
from gate.kernels.registry import get_adapter, kernel_names
from gate.kernels.tiled import TiledAdapter
from gate.kernels.user import UserAdapter

TOL = ToleranceConfig()


@pytest.fixture(autouse=True)
def _repo_root(in_repo_root):
    """tests.buggy_kernels imports from the repository root."""


def case(**kw):
    base = dict(
        batch=2, seqlen_q=48, seqlen_k=48, heads_q=4, heads_kv=4, head_dim=32, head_dim_v=32, dtype="bf16", seeds=(0, 1)
    )
    if kw.get("varlen"):
        n = max(kw["varlen"])
        base.update(batch=len(kw["varlen"]), seqlen_q=n, seqlen_k=n)
    return Case.build(**{**base, **kw})


# Every axis the reference supports; tiled claims them all.
AXES = {
    "causal-q>k-masked-rows": dict(seqlen_q=70, seqlen_k=40, causal=True),
    "causal-q<k": dict(seqlen_q=33, seqlen_k=90, causal=True),
    "window": dict(seqlen_q=80, seqlen_k=80, window=(16, 4)),
    "window-causal-gqa": dict(seqlen_q=80, seqlen_k=100, heads_kv=2, window=(20, 0), causal=True),
    "softcap": dict(softcap=5.0, causal=True),
    "alibi": dict(alibi=True, seqlen_q=40, seqlen_k=72),
    "softcap-alibi-window": dict(softcap=10.0, alibi=True, window=(8, 8)),
    "mqa": dict(heads_kv=1, causal=True),
    "dv!=d": dict(head_dim_v=16, causal=True),
    "varlen-with-empty": dict(varlen=(1, 37, 0, 70), heads_kv=2, causal=True),
    "fp16": dict(dtype="fp16", seqlen_q=65, seqlen_k=130, causal=True),
    "fp32": dict(dtype="fp32", seqlen_q=65, seqlen_k=33, head_dim=40, head_dim_v=40, causal=True),
    "seqlen-1": dict(seqlen_q=1, seqlen_k=1),
}


def assert_pass(result):
    assert result.status is Status.PASS, f"{result.case_id}: {result.status.value} {result.reason}"
    assert {"out", "dq", "dk", "dv"} <= {t.tensor for t in result.tensors}


@pytest.mark.parametrize("kw", AXES.values(), ids=AXES.keys())
def test_tiled_matches_reference_on_every_axis(kw):
    result = run_case(TiledAdapter(), case(**kw), "cpu", TOL)
    assert_pass(result)
    assert result.tensor("lse") is not None  # tiled exposes its LSE everywhere


@pytest.mark.parametrize(
    "kw",
    [
        dict(dropout_p=0.2, causal=True),
        dict(dropout_p=0.3, varlen=(5, 0, 40), heads_kv=2),
        dict(dropout_p=0.1, alibi=True, softcap=4.0, window=(6, 2), head_dim_v=16),
    ],
    ids=["dense", "varlen", "everything"],
)
def test_tiled_dropout_matches_reference_fed_its_own_mask(kw):
    c = case(**kw)
    assert_pass(run_case(TiledAdapter(), c, "cpu", TOL))
    # The mask is real: about p of the probabilities are dropped, and it changes the output.
    inputs = make_inputs(c, 0, "cpu")
    kout = TiledAdapter()(leaf_call(c, inputs))
    keeps = kout.dropout_keep if isinstance(kout.dropout_keep, list) else [kout.dropout_keep]
    kept = torch.cat([k.flatten() for k in keeps if k is not None]).float()
    assert abs(1 - kept.mean().item() - c.dropout_p) < 0.03
    gold_with_mask, _ = references(c, inputs, kout.dropout_keep)
    assert (gold_with_mask.out - kout.out.double()).abs().max() < 0.05
    no_drop = c.with_fields(dropout_p=0.0)
    gold_without, _ = references(no_drop, make_inputs(no_drop, 0, "cpu"), None)
    assert (gold_without.out - kout.out.double()).abs().max() > 0.1


SDPA_AXES = {
    k: AXES[k]
    for k in (
        "causal-q>k-masked-rows",
        "causal-q<k",
        "window-causal-gqa",
        "alibi",
        "mqa",
        "varlen-with-empty",
        "fp16",
        "fp32",
        "seqlen-1",
    )
}


@pytest.mark.parametrize("kw", SDPA_AXES.values(), ids=SDPA_AXES.keys())
@pytest.mark.parametrize("kernel", ["sdpa-cpu", "sdpa-math"])
def test_torch_cpu_attention_matches_reference(kernel, kw):
    assert_pass(run_case(get_adapter(kernel), case(**kw), "cpu", TOL))


def test_sdpa_math_takes_dv_different_from_d():
    assert_pass(run_case(get_adapter("sdpa-math"), case(head_dim_v=16, causal=True), "cpu", TOL))


# --- capability SKIPs carry reasons ------------------------------------------------------------


@pytest.mark.parametrize(
    "kernel, kw, reason",
    [
        ("sdpa-cpu", dict(softcap=5.0), "no softcap"),
        ("sdpa-cpu", dict(head_dim_v=16), "head_dim_v != head_dim"),
        ("sdpa-cpu", dict(dropout_p=0.1), "no dropout"),
        ("tests.buggy_kernels:correct_out_only", dict(window=(4, 4)), "no sliding window"),
        ("tests.buggy_kernels:correct_out_only", dict(alibi=True), "no ALiBi"),
        ("tests.buggy_kernels:correct", dict(dropout_p=0.1), "no dropout"),
        ("sdpa-flash", dict(), "runs on cuda, not cpu"),
    ],
)
def test_a_case_the_kernel_cannot_run_is_skipped_with_its_reason(kernel, kw, reason):
    result = run_case(get_adapter(kernel), case(**kw), "cpu", TOL)
    assert result.status is Status.SKIP and reason in result.reason and result.tensors == ()


def test_capability_reasons_are_specific():
    caps = Capabilities(
        devices=("cpu",),
        dtypes=("bf16",),
        max_head_dim=64,
        head_dim_multiple=8,
        features=feature_set(seqlen_q_ne_k=False, causal=False, varlen=False, gqa=False),
    )
    assert caps.unsupported_reason(case(dtype="fp16"), "cpu") == "no fp16 (supports bf16)"
    assert caps.unsupported_reason(case(head_dim=128, head_dim_v=128), "cpu") == "head_dim > 64"
    assert caps.unsupported_reason(case(head_dim=36, head_dim_v=36), "cpu") == "head_dim not a multiple of 8"
    assert caps.unsupported_reason(case(seqlen_k=64), "cpu") == "seqlen_q != seqlen_k"
    assert caps.unsupported_reason(case(causal=True), "cpu") == "no causal mask"
    assert caps.unsupported_reason(case(varlen=(3, 5)), "cpu") == "no varlen"
    assert caps.unsupported_reason(case(heads_kv=2), "cpu") == "no GQA/MQA"
    assert caps.unsupported_reason(case(), "cuda") == "runs on cpu, not cuda"
    assert caps.unsupported_reason(case(), "cpu") is None


def test_a_user_kernel_supports_what_its_signature_takes():
    full, bare = (
        UserAdapter("tests.buggy_kernels:correct").capabilities(),
        UserAdapter("tests.buggy_kernels:correct_out_only").capabilities(),
    )
    assert full.supports(Feature.WINDOW) and full.supports(Feature.ALIBI) and full.returns_lse
    assert not full.supports(Feature.SOFTCAP)
    assert not (bare.supports(Feature.WINDOW) or bare.supports(Feature.ALIBI) or bare.returns_lse)
    assert bare.supports(Feature.CAUSAL)


# --- broken kernels are rows, not crashes ----------------------------------------------------


@pytest.mark.parametrize(
    "name, status, words",
    [
        ("raises", Status.ERROR, "RuntimeError: planted crash: kernel launch failed"),
        ("wrong_shape", Status.FAIL, "out has shape (2, 4, 48, 32), expected (2, 48, 4, 32)"),
        ("returns_nan", Status.FAIL, "out contains NaN/Inf"),
    ],
)
def test_a_broken_kernel_is_a_row_naming_the_problem(name, status, words):
    result = run_case(UserAdapter(f"tests.buggy_kernels:{name}"), case(causal=True), "cpu", TOL)
    assert result.status is status and words in result.reason, result.reason
    assert "\n" not in result.reason  # one line: the table and the note stay readable


class _Adapter(KernelAdapter):
    """A minimal adapter whose call is supplied by the test."""

    name = "test-adapter"

    def __init__(self, fn, **caps):
        self.fn, self.caps = fn, caps

    def capabilities(self):
        return Capabilities(devices=("cpu",), dtypes=("bf16",), **self.caps)

    def __call__(self, call):
        return self.fn(call)


def _tiled(call):
    return TiledAdapter()(call)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda call: _tiled(call).out, "adapter returned Tensor, not KernelOutput"),
        (
            lambda call: KernelOutput(out=_tiled(call).out.float()),
            "out has dtype torch.float32, expected torch.bfloat16",
        ),
        (lambda call: KernelOutput(out=_tiled(call).out * float("inf")), "out contains NaN/Inf"),
        (lambda call: KernelOutput(out=_tiled(call).out, lse=torch.zeros(3)), "lse has shape (3,)"),
        (lambda call: KernelOutput(out=_tiled(call).out.detach()), "out has no autograd graph back to q, k, v"),
        (
            lambda call: KernelOutput(out=_tiled(call).out.detach() + 0 * call.q.sum()),
            "dk is missing: out does not depend on k",
        ),
    ],
)
def test_an_adapter_returning_garbage_fails(fn, words):
    result = run_case(_Adapter(fn), case(), "cpu", TOL)
    assert result.status is Status.FAIL and words in result.reason, result.reason


def test_dropout_without_an_observable_mask_fails():
    fn = lambda call: KernelOutput(out=TiledAdapter()(call).out)  # noqa: E731 (drops the mask)
    result = run_case(_Adapter(fn, features=feature_set(dropout=True)), case(dropout_p=0.2), "cpu", TOL)
    assert result.status is Status.FAIL and "exposed no dropout mask" in result.reason


def test_a_crash_in_one_case_does_not_stop_the_next():
    calls = []

    def flaky(call):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("out of memory")
        return _tiled(call)

    adapter = _Adapter(flaky)
    first, second = run_case(adapter, case(), "cpu", TOL), run_case(adapter, case(causal=True), "cpu", TOL)
    assert first.status is Status.ERROR and "MemoryError: out of memory" in first.reason
    assert second.status is Status.PASS


# --- GPU-only kernels on a CPU machine -------------------------------------------------------

GPU_ONLY = ["fa2", "fa3", "fa4", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_kernels_lists_gpu_kernels_as_unavailable(capsys):
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert set(lines) == set(kernel_names())
    for name in GPU_ONLY:
        assert "unavailable: needs a CUDA GPU" in lines[name], lines[name]
    for name in ("sdpa-cpu", "sdpa-math", "tiled"):
        assert lines[name].split()[1] == "available"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
@pytest.mark.parametrize("kernel", GPU_ONLY)
def test_sweep_of_an_unavailable_kernel_exits_2_with_the_reason(kernel, capsys, tmp_path):
    assert main(["sweep", "--kernel", kernel, "--suite", "smoke", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"attn-gate: error: kernel {kernel!r} is unavailable here: {get_adapter(kernel).unavailable_reason()}; "
        f"on cpu try "
    )  # and what runs here instead
    assert "needs a CUDA GPU" in err and not list(tmp_path.iterdir())


def test_a_trimmed_fa3_build_skips_what_its_config_says_it_was_built_without(monkeypatch):
    """FA3's setup.py writes its FLASH_ATTENTION_DISABLE_* switches into flash_attn_config.CONFIG:
    the adapter reads them, so the trimmed build carried to the H200 (.fa3: no softcap, no head dim
    above 128, no dv != d) SKIPS those cases with the reason instead of raising in each."""
    import sys
    import types

    from gate.kernels.flash_attn import FA3Adapter

    def d128(**kw):  # the module's case() at the build's head dim
        return case(**{"head_dim": 128, "head_dim_v": 128, "seeds": (0,), **kw})

    full = FA3Adapter().capabilities()  # no flash_attn_config here: the full build's capabilities
    assert full.supports(Feature.SOFTCAP) and full.max_head_dim == 256 and full.supports(Feature.HEAD_DIM_V_DIFFERS)
    assert not full.notes
    flags = {
        "FLASHATTENTION_DISABLE_SOFTCAP": True,
        "FLASHATTENTION_DISABLE_HDIM96": True,
        "FLASHATTENTION_DISABLE_HDIM192": True,
        "FLASHATTENTION_DISABLE_HDIM256": True,
        "FLASHATTENTION_DISABLE_HDIM64": False,
        "FLASHATTENTION_DISABLE_HDIM128": False,
        "FLASH_ATTENTION_DISABLE_HDIMDIFF64": True,
        "FLASH_ATTENTION_DISABLE_HDIMDIFF192": True,
        "FLASHATTENTION_DISABLE_APPENDKV": True,
        "FLASHATTENTION_DISABLE_FP16": False,
        "FLASHATTENTION_ENABLE_VCOLMAJOR": False,
    }
    monkeypatch.setitem(sys.modules, "flash_attn_config", types.SimpleNamespace(CONFIG={"build_flags": flags}))
    a = FA3Adapter()
    caps = a.capabilities()
    assert not caps.supports(Feature.SOFTCAP) and caps.max_head_dim == 128
    assert not caps.supports(Feature.HEAD_DIM_V_DIFFERS) and caps.supports(Feature.WINDOW)
    assert "softcap" in caps.notes[0] and "hdim256" in caps.notes[0] and "vcolmajor" not in caps.notes[0]
    assert "softcap" in caps.unsupported_reason(d128(softcap=30.0), "cuda")
    assert "head_dim > 128" in caps.unsupported_reason(d128(head_dim=192, head_dim_v=192), "cuda")
    assert "head_dim_v" in caps.unsupported_reason(d128(head_dim_v=64), "cuda")
    assert caps.unsupported_reason(d128(head_dim=72, head_dim_v=72), "cuda") is None  # 72 runs the 128 kernel
    assert "append-KV" in a.unsupported_reason(d128(entry="kvcache", seqlen_q=1, seqlen_k=256, cache_new=True), "cuda")


@pytest.mark.parametrize(
    "d, dv, runs",
    [
        (144, 128, True),
        (160, 128, True),
        (192, 128, True),
        (128, 96, False),
        (256, 128, False),
        (64, 256, True),
        (96, 64, False),
    ],
)
def test_fa3_declares_its_head_dim_pairs(d, dv, runs):
    """FA3 raises on a V head dim pair outside its rule: the adapter skips it with FA3's words instead."""
    from gate.kernels.flash_attn import FA3Adapter

    reason = FA3Adapter().unsupported_reason(case(head_dim=d, head_dim_v=dv, seeds=(0,)), "cuda")
    assert (reason is None) == runs, reason
    assert runs or "(128, 192]" in reason


def _eager_flex():
    """The flex adapter with flex_attention uncompiled, allowed on the CPU (forward only: Flex has no CPU
    backward), so its mods and block masks can be checked here."""
    from gate.kernels.flex import FlexAdapter

    return _eager(FlexAdapter)


def _forward_call(c, x):
    """The case's call with q, k, v detached: Flex has no CPU backward."""
    import dataclasses

    call = leaf_call(c, x)
    return dataclasses.replace(call, q=call.q.detach(), k=call.k.detach(), v=call.v.detach())


@pytest.mark.slow
def test_flex_never_hands_one_tensor_to_two_mod_slots():
    """The flex adapter's mods read their numbers (diagonal offset, window sides, softcap, cache
    lengths) from captured device tensors made once per value. Two slots sharing one tensor when
    their values coincide (offset 0 and right 0 on a square sequence, left 4 and nq 4 in decode)
    makes dynamo's no-aliasing guard fail for any cached compile made while the sharing was otherwise
    (by an earlier case in the same worker, or an earlier sequence of a varlen case); on torch 2.11
    that guard's failure report re-reads the old compile's sources and crashed where they pass through
    a score_mod that is now None (two flex "__closure__" ERRORs of an H200 nightly,
    pytorch #176211). Every slot gets its own, so that guard cannot fail."""

    def assert_no_shared_slot(adapter):
        for holder, *_ in adapter._mod_cache.values():
            tensors = [t for t in holder.values() if isinstance(t, torch.Tensor)]
            assert len({id(t) for t in tensors}) == len(tensors), sorted(holder)

    adapter = _eager_flex()
    square = case(causal=True, window=(16, 0), heads_kv=2)  # offset 0 == right 0
    x = make_inputs(square, 0, "cpu")
    adapter.prepare(square)
    out = adapter(_forward_call(square, x)).out
    gold, _ = references(square, x, None)
    assert float((out.double() - gold.out).abs().max()) < 0.02
    assert_no_shared_slot(adapter)
    decode = Case.build(
        batch=3,
        seqlen_q=4,
        seqlen_k=100,
        heads_q=4,
        heads_kv=2,
        head_dim=32,
        head_dim_v=32,
        dtype="bf16",
        entry="kvcache",
        cache_seqlens=(5, 60, 9),
        cache_new=True,
        window=(4, 4),
    )  # left 4 == nq 4 == right 4
    result = run_case(adapter, decode, "cpu", TOL)
    assert result.status is Status.PASS, result.reason
    assert_no_shared_slot(adapter)


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("c++") or shutil.which("g++")), reason="torch.compile on CPU needs a C++ compiler"
)
def test_flex_builds_long_block_masks_compiled_and_short_ones_eagerly(monkeypatch):
    """Past EAGER_BLOCK_MASK_MAX_ELEMENTS the flex adapter builds its block mask with a compiled
    create_block_mask: the eager build evaluates the mask_mod densely and ran the H200 out of memory
    at 65,537 keys with a document mask (136 GiB in that process on an H200). The threshold is lowered
    here so a small document-mask case crosses it: the compiled build must give the block mask the eager
    one gives and the output must still match the reference; under the threshold the compiled builder
    is never made."""
    import gate.kernels.flex as flex_module

    document = case(bias="document", seqlen_q=200, seqlen_k=200, batch=1)
    x = make_inputs(document, 0, "cpu")
    call = _forward_call(document, x)
    gold, _ = references(document, x, None)

    def build(threshold):
        monkeypatch.setattr(flex_module, "EAGER_BLOCK_MASK_MAX_ELEMENTS", threshold)
        adapter = _eager_flex()
        adapter.prepare(document)
        out = adapter(call).out
        assert float((out.double() - gold.out).abs().max()) < 0.02
        (block_mask,) = adapter._block_masks.values()
        return adapter, block_mask

    eager_adapter, eager = build(1 << 40)
    assert eager_adapter._compiled_block_mask is None
    compiled_adapter, compiled = build(200 * 200 - 1)
    assert compiled_adapter._compiled_block_mask is not None
    for part in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(eager, part), getattr(compiled, part)), part


@pytest.mark.parametrize(
    "name, native",
    [("sdpa-cpu", True), ("sdpa-math", True), ("sdpa-cpu-copyheads", False), ("sdpa-math-copyheads", False)],
)
def test_sdpa_hands_gqa_to_torch_or_copies_heads_by_name(name, native, monkeypatch):
    """GQA/MQA reach SDPA's own GQA path (enable_gqa=True, K/V with their own head count); the
    -copyheads kernels repeat the K/V heads instead. Both pass the case."""
    import torch.nn.functional as F

    from gate.core.config import ToleranceConfig
    from gate.core.results import Status
    from gate.correctness.run_case import run_case
    from gate.kernels.registry import get_adapter

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.shape[1], k.shape[1], kwargs.get("enable_gqa", False)))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    gqa = case(heads_q=8, heads_kv=2, causal=True, seeds=(0,))
    result = run_case(get_adapter(name), gqa, "cpu", ToleranceConfig())
    assert result.status is Status.PASS, result.reason
    assert seen and set(seen) == ({(8, 2, True)} if native else {(8, 8, False)})


def _eager(cls, *args, calls: list | None = None):
    """`cls(*args)` (a flex adapter) with flex_attention uncompiled and allowed on the CPU (forward only);
    with `calls`, each flex_attention call's (q, k, block_mask, kernel_options) is appended to it."""
    import dataclasses

    from torch.nn.attention.flex_attention import flex_attention

    def recorded(q, k, v, **kwargs):
        calls.append((q, k, kwargs.get("block_mask"), kwargs.get("kernel_options")))
        return flex_attention(q, k, v, **kwargs)

    class Eager(cls):
        def capabilities(self):
            return dataclasses.replace(super().capabilities(), devices=("cpu", "cuda"))

        def _fn(self):
            return flex_attention if calls is None else recorded

    return Eager(*args)


ADJUSTED_CASES = [
    case(seqlen_q=97, seqlen_k=257, causal=True),  # bottom-right causal, partial blocks
    case(seqlen_q=300, seqlen_k=200, window=(40, 16)),  # both window sides, more queries than keys
    case(seqlen_q=130, seqlen_k=130, bias="document"),  # a boolean custom mask: built exactly
]


@pytest.mark.parametrize("c", ADJUSTED_CASES, ids=lambda c: c.id)
def test_flex_adjusted_mask_crops_to_the_cases_own_mask_and_answers_the_same(c):
    """flex-adjusted-mask builds each block mask for a grid 300 longer each way and crops it with
    BlockMask._adjust: block for block the mask `flex` builds for the case, and the same output."""
    from gate.kernels.flex import FlexAdapter, FlexAdjustedMaskAdapter

    x = make_inputs(c, 0, "cpu")
    exact, adjusted = _eager(FlexAdapter), _eager(FlexAdjustedMaskAdapter)
    outs = []
    for adapter in (exact, adjusted):
        adapter.prepare(c)
        outs.append(adapter(_forward_call(c, x)).out)
    (mask_exact,), (mask_adjusted,) = exact._block_masks.values(), adjusted._block_masks.values()
    assert mask_adjusted.seq_lengths == (c.seqlen_q, c.seqlen_k)
    assert torch.equal(mask_exact.to_dense(), mask_adjusted.to_dense())
    assert torch.equal(outs[0], outs[1])
    gold, _ = references(c, x, None)
    assert float((outs[1].double() - gold.out).abs().max()) < 0.05


def test_flex_dynamic_compiles_with_dynamic_shapes(monkeypatch):
    from gate.kernels.flex import FlexAdapter, FlexDynamicAdapter

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    FlexDynamicAdapter()._fn()
    FlexAdapter()._fn()
    assert seen == [{"dynamic": True}, {"dynamic": False}]
    assert get_adapter("flex-dynamic").name == "flex-dynamic" and get_adapter("flex-adjusted-mask").mask_margin == 300


@pytest.mark.parametrize(
    "head_dim, runs",
    [
        (64, True),
        (40, True),
        (128, True),
        (100, True),
        (32, False),
        (80, False),
        (96, False),
        (160, False),
        (256, False),
    ],
)
def test_a_trimmed_fa2_build_skips_the_head_dims_it_did_not_compile(monkeypatch, head_dim, runs):
    """scripts/build-flash-attn.sh records FA2's compiled head-dim kernels in
    flash_attn/attn_gate_build.py; the adapter SKIPs the others with that reason (an ERROR row of
    the build's "not compiled" otherwise), and a full build (no record) runs them all."""
    import types

    import gate.kernels.flash_attn as fa
    from gate.kernels.flash_attn import FA2Adapter

    fa.fa2_head_dim_kernels.cache_clear()  # read once per process: each scenario here is another build
    monkeypatch.setattr(
        fa,
        "_import",
        lambda name: (
            types.SimpleNamespace(HEAD_DIM_KERNELS=(64, 128))
            if name == "flash_attn.attn_gate_build"
            else pytest.fail(name)
        ),
    )
    c = case(head_dim=head_dim, head_dim_v=head_dim, seeds=(0,))
    reason = FA2Adapter().unsupported_reason(c, "cuda")
    assert (reason is None) == runs, reason
    assert runs or "compiles only the head-dim kernels 64, 128" in reason

    def no_record(name):
        raise ImportError(name)

    monkeypatch.setattr(fa, "_import", no_record)
    fa.fa2_head_dim_kernels.cache_clear()
    assert FA2Adapter().unsupported_reason(c, "cuda") is None
    fa.fa2_head_dim_kernels.cache_clear()  # no fake build outlives this test


PACKED_CASES = [
    case(varlen=(1, 97, 0, 130), causal=True),  # an empty sequence, a single token, tile edges
    case(
        varlen=(40, 70, 33), varlen_k=(50, 60, 90), seqlen_k=90, causal=True, heads_kv=2
    ),  # keys per sequence differ: bottom-right in each
    case(varlen=(64, 5, 100), window=(16, 8), softcap=20.0),  # both window sides, a softcap score_mod
    case(varlen=(30, 80), alibi=True, causal=True, heads_kv=2),  # ALiBi on positions inside each sequence
]


@pytest.mark.parametrize("c", PACKED_CASES, ids=lambda c: c.id)
def test_flex_packed_runs_a_varlen_case_as_one_call_and_matches_the_reference(c):
    """flex-packed: one flex call over the packed sequences with a document mask_mod (and the
    softcap / ALiBi score_mods on positions inside each sequence), FlexAttention's own varlen;
    its forward agrees with the per-sequence `flex` and with the float64 reference."""
    from gate.kernels.flex import FlexAdapter, FlexPackedAdapter

    x = make_inputs(c, 0, "cpu")
    packed, alone = _eager(FlexPackedAdapter), _eager(FlexAdapter)
    for adapter in (packed, alone):
        adapter.prepare(c)
    got, ref = packed(_forward_call(c, x)), alone(_forward_call(c, x))
    assert len(packed._block_masks) == 1 and len(alone._block_masks) <= len(c.entry.varlen)  # one mask, one call
    gold, _ = references(c, x, None)
    assert got.out.shape == gold.out.shape and got.lse.shape == gold.lse.shape
    assert float((got.out.double() - gold.out).abs().max()) < 0.05
    assert float((got.out.double() - ref.out.double()).abs().max()) < 0.02
    rows = torch.isfinite(gold.lse)
    assert torch.equal(rows, torch.isfinite(got.lse)) and float((got.lse.double() - gold.lse)[rows].abs().max()) < 1e-2


@pytest.mark.parametrize("bias", ["bool_mask", "dense"])
def test_flex_varlen_sequences_read_their_own_block_of_a_packed_bias(bias):
    """Two sequences of one length: each builds its block mask from its own block of the packed
    mask (a mask cached by shape alone would hand the second the first's), and the forward agrees
    with the float64 reference."""
    from gate.kernels.flex import FlexAdapter

    c = case(varlen=(40, 40, 7), causal=True, heads_kv=2, bias=bias)
    x = make_inputs(c, 0, "cpu")
    assert not torch.equal(x.bias[0, :, :40, :40], x.bias[0, :, 40:80, 40:80])  # one length, two blocks
    flex = _eager(FlexAdapter)
    flex.prepare(c)
    got = flex(_forward_call(c, x))
    gold, _ = references(c, x, None)
    assert float((got.out.double() - gold.out).abs().max()) < 0.05
    if bias == "bool_mask":
        assert len(flex._block_masks) == 3  # one per sequence


@pytest.mark.parametrize("bias", ["dense", "bool_mask", "broadcast_h"])
def test_flex_packed_reads_a_packed_bias_at_packed_positions(bias):
    """flex-packed with a custom bias: one call, the score_mod (or mask_mod) reading the packed bias
    at packed positions, so each sequence reads its own block; it agrees with the per-sequence
    `flex` and with the float64 reference."""
    from gate.kernels.flex import FlexAdapter, FlexPackedAdapter

    c = case(varlen=(40, 40, 0, 7), causal=True, heads_kv=2, bias=bias)
    x = make_inputs(c, 0, "cpu")
    packed, alone = _eager(FlexPackedAdapter), _eager(FlexAdapter)
    for adapter in (packed, alone):
        adapter.prepare(c)
    got, ref = packed(_forward_call(c, x)), alone(_forward_call(c, x))
    assert len(packed._block_masks) == 1  # one call
    gold, _ = references(c, x, None)
    assert float((got.out.double() - gold.out).abs().max()) < 0.05
    assert float((got.out.double() - ref.out.double()).abs().max()) < 0.02


def decode_case(**kw):
    base = dict(
        batch=3, seqlen_q=4, seqlen_k=300, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32, dtype="bf16", seeds=(0,)
    )
    return Case.build(**{**base, "entry": "kvcache", **kw})


# Key lengths never a whole number of pages (128 for a contiguous cache): each element's last page is partial.
PAGED_CASES = [
    decode_case(cache_seqlens=(5, 160, 286), cache_new=True, causal=True),  # contiguous: pages of 128 reserved
    decode_case(cache_seqlens=(33, 250, 1), page_size=16, shuffled_pages=True, heads_kv=1, window=(20, 0)),  # MQA
    decode_case(cache_seqlens=(70, 9, 200), page_size=64, cache_new=True, heads_kv=4, softcap=5.0, alibi=True),
    decode_case(seqlen_q=1, cache_seqlens=(129, 7, 255), page_size=256, cache_new=True, causal=True),
]


@pytest.mark.parametrize("c", PAGED_CASES, ids=lambda c: c.id)
def test_flex_paged_decodes_through_paged_attention_and_matches_the_reference(c):
    """flex-paged: K/V read from one physical cache of pages, (1, Hkv, pages x page, D), with the block
    mask converted to physical pages (its key blocks one page, its keys every slot of the cache) and the
    new tokens `assign`ed where the case's cache holds them: out, LSE and the cache after the call pass
    against the float64 reference."""
    from gate.kernels.flex import PAGE, FlexPagedAdapter

    calls: list = []
    result = run_case(_eager(FlexPagedAdapter, calls=calls), c, "cpu", TOL)
    assert result.status is Status.PASS, result.reason
    assert {"out", "lse", "k_cache", "v_cache"} <= {t.tensor for t in result.tensors} or not c.entry.cache_new
    page = c.entry.page_size or PAGE
    (q, k, block_mask, _), *_ = calls
    assert k.shape[0] == 1 and k.shape[2] % page == 0 and k.shape[2] > max(c.cached_lengths)  # the physical cache
    assert block_mask.BLOCK_SIZE[1] == page and block_mask.seq_lengths == (c.seqlen_q, k.shape[2])
    assert any(n % page for n in c.cached_lengths)


def test_flex_paged_reserves_pages_out_of_order_for_a_contiguous_cache():
    """A contiguous cache's pages come from PagedAttention.reserve, page j of every element before
    page j + 1 of any: an element's second page is not the one after its first."""
    from gate.kernels.flex import PAGE, FlexPagedAdapter

    c = PAGED_CASES[0]
    x = make_inputs(c, 0, "cpu")
    paged, k_phys, _ = FlexPagedAdapter()._pages(leaf_call(c, x).cache, [9, 164, 290], torch.device("cpu"))
    table = paged.page_table[:, :3]
    assert bool((table[:, 1] - table[:, 0] != 1).all())  # no element's pages are neighbours
    assert k_phys.shape == (1, c.heads_kv, 3 * 3 * PAGE, c.head_dim)
    # the cached tokens of element 2, read back through the page table, are the case's
    tokens = torch.cat([k_phys[0, :, int(p) * PAGE : (int(p) + 1) * PAGE] for p in table[2]], dim=1)[:, :286]
    assert torch.equal(tokens, x.cache.k_cache[2, :286].transpose(0, 1))


@pytest.mark.parametrize("c", [PAGED_CASES[0], PAGED_CASES[2]], ids=lambda c: c.id)
def test_flex_paged_fails_when_pages_map_to_the_wrong_logical_blocks(c):
    """The converted mods read PagedAttention's physical-to-logical map: shifting it by one page
    (every page read as its neighbour's logical block) turns the answer wrong, so the passing runs
    above depend on the paged path, not on a dense read that ignores it."""
    from gate.kernels.flex import FlexPagedAdapter

    class Shifted(FlexPagedAdapter):
        def _pages(self, *args):
            paged, k_phys, v_phys = super()._pages(*args)
            paged.physical_to_logical.copy_(paged.physical_to_logical.roll(1, dims=1))
            return paged, k_phys, v_phys

    result = run_case(_eager(Shifted), c, "cpu", TOL)
    assert result.status is Status.FAIL, result.reason


def test_flex_paged_skips_a_page_flex_cannot_tile():
    from gate.kernels.flex import FlexPagedAdapter

    reason = FlexPagedAdapter().unsupported_reason(decode_case(cache_seqlens=(5, 9, 20), page_size=7), "cuda")
    assert "page_size 7" in reason and "powers of two >= 16" in reason
    assert FlexPagedAdapter().unsupported_reason(PAGED_CASES[1], "cuda") is None


SLICED_CASES = [
    case(seqlen_q=300, seqlen_k=257, causal=True, heads_kv=2),  # 3 query blocks, the last partial; GQA
    case(seqlen_q=200, seqlen_k=200, window=(40, 16), softcap=5.0, alibi=True),  # score_mods on shifted queries
    case(seqlen_q=150, seqlen_k=150, bias="document"),  # a boolean mask per batch element
    case(varlen=(130, 7, 0), causal=True, heads_kv=2),  # each sequence alone, its mask sliced
]


@pytest.mark.parametrize("c", SLICED_CASES, ids=lambda c: c.id)
def test_flex_sliced_mask_slices_a_batch_and_heads_mask_per_query_block(c):
    """flex-sliced-mask: the block mask built for every batch element and head, then one flex call per
    128-query block with mask[:, :, i] (B and H kept, one row of blocks) and the mods shifted to the
    block's queries; its forward equals `flex`'s one call on the whole mask and the float64 reference."""
    from gate.kernels.flex import FlexAdapter, FlexSlicedMaskAdapter

    x = make_inputs(c, 0, "cpu")
    calls: list = []
    sliced, whole = _eager(FlexSlicedMaskAdapter, calls=calls), _eager(FlexAdapter)
    for adapter in (sliced, whole):
        adapter.prepare(c)
    got, ref = sliced(_forward_call(c, x)), whole(_forward_call(c, x))
    gold, _ = references(c, x, None)
    assert float((got.out.double() - gold.out).abs().max()) < 0.05
    assert float((got.out.double() - ref.out.double()).abs().max()) < 0.02
    rows = torch.isfinite(gold.lse)
    assert torch.equal(rows, torch.isfinite(got.lse)) and float((got.lse.double() - gold.lse)[rows].abs().max()) < 1e-2
    lengths = c.entry.varlen or (c.seqlen_q,) * 1
    assert len(calls) == sum(-(-n // 128) for n in lengths)  # one call per query block
    for q, _, block_mask, _ in calls:
        assert block_mask.kv_num_blocks.shape == (q.shape[0], c.heads_q, 1)  # (B, H) kept, one row
        assert block_mask.seq_lengths[0] == q.shape[2] <= 128


BLOCK_CASES = [
    case(seqlen_q=300, seqlen_k=257, causal=True, heads_kv=2),
    case(seqlen_q=200, seqlen_k=100, window=(40, 16), softcap=5.0, alibi=True),
    case(seqlen_q=150, seqlen_k=150, bias="document"),
    decode_case(cache_seqlens=(70, 9, 200), page_size=16, cache_new=True, causal=True),
]


@pytest.mark.parametrize("c", BLOCK_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("name, block", [("flex-block64", (64, 64)), ("flex-block128x64", (128, 64))])
def test_flex_block_size_variants_build_their_blocks_and_match_the_reference(name, block, c):
    """flex-block64 / flex-block128x64: block masks of those (query, key) blocks, handed to flex with
    kernel_options whose tiles divide them; the forward agrees with the float64 reference."""
    from gate.kernels.flex import FlexBlockSizeAdapter, block_options

    calls: list = []
    adapter = _eager(FlexBlockSizeAdapter, name, block, calls=calls)
    if c.entry.kind == "kvcache":
        result = run_case(adapter, c, "cpu", TOL)
        assert result.status is Status.PASS, result.reason
    else:
        x = make_inputs(c, 0, "cpu")
        adapter.prepare(c)
        got = adapter(_forward_call(c, x))
        gold, _ = references(c, x, None)
        assert float((got.out.double() - gold.out).abs().max()) < 0.05
    q, k, block_mask, options = calls[-1]
    assert block_mask.BLOCK_SIZE == block and options == block_options(block, q.dtype)
    assert block_mask.kv_num_blocks.shape[-1] == -(-q.shape[2] // block[0])  # rows of `block[0]` queries
    assert get_adapter(name).block_size == block


@pytest.mark.parametrize(
    "block, dtype, expected",
    [
        ((128, 128), torch.bfloat16, {}),
        ((256, 128), torch.float16, {}),
        (
            (64, 64),
            torch.bfloat16,
            {"BLOCK_M": 32, "BLOCK_N": 32} | {f"bwd_BLOCK_{n}": 32 for n in ("M1", "N1", "M2", "N2")},
        ),
        ((128, 64), torch.float16, {"BLOCK_N": 32} | {f"bwd_BLOCK_{n}": 32 for n in ("M1", "N1", "M2", "N2")}),
        ((128, 16), torch.bfloat16, {"BLOCK_N": 16} | {f"bwd_BLOCK_{n}": 16 for n in ("M1", "N1", "M2", "N2")}),
        ((64, 128), torch.float32, {"BLOCK_M": 32}),  # fp32's backward tiles are 16 already
    ],
)
def test_block_options_divide_the_blocks(block, dtype, expected):
    """Tiles that divide a block mask's blocks, and the backward's tiles one another (N1 % M1, M2 % N2)."""
    from gate.kernels.flex import block_options

    options = block_options(block, dtype)
    assert options == expected
    assert block[0] % options.get("BLOCK_M", 128) == 0 or "BLOCK_M" not in options
    assert all(block[1] % options[k] == 0 for k in ("BLOCK_N", "bwd_BLOCK_N1", "bwd_BLOCK_N2") if k in options)
