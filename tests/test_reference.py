"""gate/attention/reference.py against computations written independently here.

(a) autograd of the naive float64 formula softmax(S) V, with every mask and score modifier
    spelled out in this file (bottom-right alignment, window, softcap, ALiBi, GQA);
(b) the analytic backward written out line by line;
plus fully masked rows, chunking over queries, varlen and the dropout keep-mask path.
The golden reference must agree with both to float64 round-off.
"""

from __future__ import annotations

import itertools
import math
import os
import select
import signal

import pytest
import torch

import gate.attention.reference
from gate.attention.masks import alibi_slopes
from gate.attention.reference import AttnOptions, attention_reference

F64 = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-11)


def randn(*shape, seed, dtype=torch.bfloat16):
    """Inputs rounded to a low-precision dtype, as the kernels see them."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def naive(q, k, v, dout, scale, causal=False, window=(-1, -1), softcap=0.0, slopes=None, keep=None, dropout_p=0.0):
    """float64 autograd of O = dropout(softmax(cap(QK^T scale) + alibi + mask)) V, every step written out.

    Returns out (B, Nq, H, Dv), lse (B, H, Nq), dq, dk, dv in the inputs' layouts."""
    q, k, v = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    b, nq, hq, _ = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    qh = q.permute(0, 2, 1, 3)
    kh = torch.cat([k[:, :, h // group : h // group + 1] for h in range(hq)], dim=2).permute(0, 2, 1, 3)
    vh = torch.cat([v[:, :, h // group : h // group + 1] for h in range(hq)], dim=2).permute(0, 2, 1, 3)
    s = torch.einsum("bhid,bhjd->bhij", qh, kh) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    # Bottom-right alignment: query i sits at key position i + nk - nq.
    allowed = torch.zeros(nq, nk, dtype=torch.bool)
    bias = torch.zeros(hq, nq, nk, dtype=F64)
    left, right = window
    for i in range(nq):
        pos = i + nk - nq
        for j in range(nk):
            ok = True
            if causal and j > pos:
                ok = False
            if right >= 0 and j > pos + right:
                ok = False
            if left >= 0 and j < pos - left:
                ok = False
            allowed[i, j] = ok
            if slopes is not None:
                for h in range(hq):
                    bias[h, i, j] = -float(slopes[h]) * abs(pos - j)
    s = s + bias
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    row_max = s.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(s - row_max)
    denom = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(denom > 0, denom, torch.ones_like(denom))
    if keep is not None:
        p = p * keep.to(F64) / (1.0 - dropout_p)
    out = torch.einsum("bhij,bhjd->bhid", p, vh).permute(0, 2, 1, 3)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.to(F64))
    return out.detach(), lse.detach(), dq, dk, dv


def check_against_naive(res, expected):
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), (res.out, res.lse, res.dq, res.dk, res.dv), expected):
        assert got.dtype == F64, name
        torch.testing.assert_close(got, want, **TIGHT, msg=lambda m, name=name: f"{name}: {m}")


B, HQ = 2, 6
CONFIGS = [
    pytest.param(dict(nq=13, nk=13, hkv=6), id="plain"),
    pytest.param(dict(nq=13, nk=21, hkv=3, causal=True), id="causal-q<k-gqa"),
    pytest.param(dict(nq=21, nk=13, hkv=2, causal=True), id="causal-q>k-masked-rows"),
    pytest.param(dict(nq=17, nk=17, hkv=1, causal=True, dv=24), id="causal-mqa-dv"),
    pytest.param(dict(nq=19, nk=23, hkv=3, window=(3, 2)), id="window-3.2"),
    pytest.param(dict(nq=19, nk=19, hkv=3, window=(4, 0), causal=True), id="window-4.0-causal"),
    pytest.param(dict(nq=11, nk=16, hkv=2, window=(0, 0)), id="window-0.0"),
    pytest.param(dict(nq=20, nk=9, hkv=2, window=(1, 1)), id="window-q>k-masked-rows"),
    pytest.param(dict(nq=15, nk=22, hkv=3, softcap=2.0, causal=True), id="softcap-causal"),
    pytest.param(dict(nq=15, nk=22, hkv=6, alibi=True, causal=True), id="alibi-causal"),
    pytest.param(dict(nq=18, nk=12, hkv=2, alibi=True), id="alibi-q>k"),
    pytest.param(dict(nq=16, nk=25, hkv=3, alibi=True, softcap=3.0, window=(6, 1), dv=8), id="everything"),
]


def make_case(cfg, seed=0):
    d, dv = 16, cfg.get("dv", 16)
    q = randn(B, cfg["nq"], HQ, d, seed=seed)
    k = randn(B, cfg["nk"], cfg["hkv"], d, seed=seed + 1)
    v = randn(B, cfg["nk"], cfg["hkv"], dv, seed=seed + 2)
    dout = randn(B, cfg["nq"], HQ, dv, seed=seed + 3)
    slopes = alibi_slopes(HQ) if cfg.get("alibi") else None
    opts = AttnOptions(
        softmax_scale=d**-0.5,
        causal=cfg.get("causal", False),
        window=cfg.get("window", (-1, -1)),
        softcap=cfg.get("softcap", 0.0),
        alibi_slopes=slopes,
    )
    return q, k, v, dout, opts


def naive_for(q, k, v, dout, opts, **kw):
    return naive(q, k, v, dout, opts.softmax_scale, opts.causal, opts.window, opts.softcap, opts.alibi_slopes, **kw)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_golden_matches_autograd_of_naive_formula(cfg):
    q, k, v, dout, opts = make_case(cfg)
    res = attention_reference(q, k, v, dout, opts, F64)
    check_against_naive(res, naive_for(q, k, v, dout, opts))


def test_alibi_bias_is_exact_in_float64():
    """16 heads: slopes 2**-0.5, 2**-1.5 ... are not dyadic, so -slope * |i - j| is inexact in float32
    (relative 6e-8 of a bias up to ~300); the golden reference must form the bias in float64."""
    hq, nq, nk, d = 16, 8, 300, 16
    q, k, v, dout = (
        randn(1, nq, hq, d, seed=30),
        randn(1, nk, hq, d, seed=31),
        randn(1, nk, hq, d, seed=32),
        randn(1, nq, hq, d, seed=33),
    )
    slopes = alibi_slopes(hq)
    assert slopes[0] != 0.5 and (slopes.double() * 299 != (slopes * 299).double()).any()
    opts = AttnOptions(softmax_scale=0.25, alibi_slopes=slopes)
    res = attention_reference(q, k, v, dout, opts, F64)
    check_against_naive(res, naive_for(q, k, v, dout, opts))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_golden_matches_analytic_backward(causal):
    """dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(dP P)); dQ = dS K scale; dK = dS^T Q scale (GQA summed)."""
    b, nq, nk, hq, hkv, d, dv = 2, 14, 19, 4, 2, 16, 8
    q, k, v = randn(b, nq, hq, d, seed=10), randn(b, nk, hkv, d, seed=11), randn(b, nk, hkv, dv, seed=12)
    dout = randn(b, nq, hq, dv, seed=13)
    scale = 1 / math.sqrt(d)
    group = hq // hkv
    Q = q.to(F64).transpose(1, 2)
    K = k.to(F64).transpose(1, 2).repeat_interleave(group, dim=1)
    V = v.to(F64).transpose(1, 2).repeat_interleave(group, dim=1)
    dO = dout.to(F64).transpose(1, 2)
    S = Q @ K.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(nq).view(-1, 1) + (nk - nq)
        j = torch.arange(nk).view(1, -1)
        S = S.masked_fill(j > i, -math.inf)
    P = torch.softmax(S, dim=-1)
    O = P @ V
    dV = P.transpose(-1, -2) @ dO
    dP = dO @ V.transpose(-1, -2)
    dS = P * (dP - (dP * P).sum(dim=-1, keepdim=True))
    dQ = dS @ K * scale
    dK = dS.transpose(-1, -2) @ Q * scale
    dK = dK.view(b, hkv, group, nk, d).sum(2)
    dV = dV.view(b, hkv, group, nk, dv).sum(2)

    res = attention_reference(q, k, v, dout, AttnOptions(softmax_scale=scale, causal=causal), F64)
    torch.testing.assert_close(res.out, O.transpose(1, 2), **TIGHT)
    torch.testing.assert_close(res.dq, dQ.transpose(1, 2), **TIGHT)
    torch.testing.assert_close(res.dk, dK.transpose(1, 2), **TIGHT)
    torch.testing.assert_close(res.dv, dV.transpose(1, 2), **TIGHT)
    torch.testing.assert_close(res.lse, torch.logsumexp(S, dim=-1), **TIGHT)


@pytest.mark.parametrize(
    "cfg, masked_rows",
    [
        (dict(nq=21, nk=13, hkv=2, causal=True), range(0, 8)),  # rows i < nq - nk see no key
        (
            dict(nq=20, nk=9, hkv=2, window=(1, 1)),
            range(0, 10),
        ),  # diag = i - 11; the window [diag-1, diag+1] misses 0..8
    ],
)
@pytest.mark.parametrize("dtype", [F64, torch.bfloat16])
def test_fully_masked_rows_give_zero_output_and_gradient(cfg, masked_rows, dtype):
    q, k, v, dout, opts = make_case(cfg)
    res = attention_reference(q, k, v, dout, opts, dtype)
    rows = list(masked_rows)
    for name in ("out", "dq", "dk", "dv"):
        assert torch.isfinite(res.tensors()[name]).all(), name
    assert (res.out[:, rows] == 0).all() and (res.dq[:, rows] == 0).all()
    assert torch.isneginf(res.lse[:, :, rows]).all()
    assert torch.isfinite(res.lse[:, :, rows[-1] + 1 :]).all()
    assert (res.out[:, rows[-1] + 1 :].abs().sum(dim=(-1, -2)) > 0).all()
    # The masked rows' dO must not leak into dK/dV: changing it changes nothing.
    dout2 = dout.clone()
    dout2[:, rows] = 7.0
    res2 = attention_reference(q, k, v, dout2, opts, dtype)
    assert torch.equal(res2.dk, res.dk) and torch.equal(res2.dv, res.dv)


@pytest.mark.parametrize("cfg", [CONFIGS[2], CONFIGS[-1]])
def test_chunking_over_queries_changes_nothing(cfg, monkeypatch):
    q, k, v, dout, opts = make_case(cfg)
    whole = attention_reference(q, k, v, dout, opts, F64)
    nk = k.shape[1]
    monkeypatch.setattr(gate.attention.reference, "CHUNK_ELEMENTS", 3 * B * HQ * nk)  # 3 query rows per chunk
    chunked = attention_reference(q, k, v, dout, opts, F64)
    for name, t in whole.tensors().items():
        torch.testing.assert_close(chunked.tensors()[name], t, **TIGHT, msg=lambda m, name=name: f"{name}: {m}")
    monkeypatch.setattr(gate.attention.reference, "CHUNK_ELEMENTS", 1)  # one row per chunk
    single = attention_reference(q, k, v, dout, opts, F64)
    torch.testing.assert_close(single.dk, whole.dk, **TIGHT)
    torch.testing.assert_close(single.out, whole.out, **TIGHT)


def packed(lengths, hq=4, hkv=2, d=16, dv=8, seed=20):
    total = sum(lengths)
    q, k, v = randn(total, hq, d, seed=seed), randn(total, hkv, d, seed=seed + 1), randn(total, hkv, dv, seed=seed + 2)
    dout = randn(total, hq, dv, seed=seed + 3)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    return q, k, v, dout, cu


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_equals_each_sequence_alone(causal):
    lengths = [5, 0, 1, 12, 0, 9]
    q, k, v, dout, cu = packed(lengths)
    slopes = alibi_slopes(4)
    opts = AttnOptions(softmax_scale=0.25, causal=causal, window=(4, -1), alibi_slopes=slopes)
    res = attention_reference(q, k, v, dout, opts, F64, cu_seqlens=cu)
    assert res.out.shape == (sum(lengths), 4, 8) and res.lse.shape == (4, sum(lengths))
    offsets = cu.tolist()
    for a, z in zip(offsets[:-1], offsets[1:]):
        if a == z:
            continue
        want = naive(q[a:z][None], k[a:z][None], v[a:z][None], dout[a:z][None], 0.25, causal, (4, -1), 0.0, slopes)
        got = (res.out[a:z][None], res.lse[:, a:z][None], res.dq[a:z][None], res.dk[a:z][None], res.dv[a:z][None])
        for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            torch.testing.assert_close(g, w, **TIGHT, msg=lambda m, name=name: f"seq {a}:{z} {name}: {m}")


def test_varlen_of_only_empty_and_single_sequences():
    q, k, v, dout, cu = packed([0, 1, 0])
    res = attention_reference(q, k, v, dout, AttnOptions(softmax_scale=0.25, causal=True), F64, cu_seqlens=cu)
    want = naive(q[None], k[None], v[None], dout[None], 0.25, causal=True)
    torch.testing.assert_close(res.out, want[0][0], **TIGHT)
    torch.testing.assert_close(res.dk, want[3][0], **TIGHT)


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[2], CONFIGS[-1]])
def test_dropout_keep_mask_matches_naive_masked_formula(cfg):
    q, k, v, dout, opts = make_case(cfg)
    p = 0.3
    opts = AttnOptions(**{**opts.__dict__, "dropout_p": p})
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(B, HQ, q.shape[1], k.shape[1], generator=g) >= p
    res = attention_reference(q, k, v, dout, opts, F64, dropout_keep=keep)
    check_against_naive(res, naive_for(q, k, v, dout, opts, keep=keep, dropout_p=p))
    # The mask matters: without it the answer is different.
    plain = attention_reference(q, k, v, dout, AttnOptions(**{**opts.__dict__, "dropout_p": 0.0}), F64)
    assert (plain.out - res.out).abs().max() > 0.1


def test_dropout_varlen_uses_one_mask_per_sequence():
    lengths = [6, 0, 11]
    q, k, v, dout, cu = packed(lengths, hq=2, hkv=2)
    p = 0.25
    g = torch.Generator().manual_seed(3)
    keeps = [None if n == 0 else torch.rand(1, 2, n, n, generator=g) >= p for n in lengths]
    opts = AttnOptions(softmax_scale=0.25, causal=True, dropout_p=p)
    res = attention_reference(q, k, v, dout, opts, F64, cu_seqlens=cu, dropout_keep=keeps)
    offsets = cu.tolist()
    for keep, a, z in zip(keeps, offsets[:-1], offsets[1:]):
        if keep is None:
            continue
        want = naive(q[a:z][None], k[a:z][None], v[a:z][None], dout[a:z][None], 0.25, True, keep=keep, dropout_p=p)
        torch.testing.assert_close(res.out[a:z], want[0][0], **TIGHT)
        torch.testing.assert_close(res.dq[a:z], want[2][0], **TIGHT)
        torch.testing.assert_close(res.dv[a:z], want[4][0], **TIGHT)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_reference_is_the_same_math_in_the_input_dtype(dtype):
    """P keeps the input dtype (LSE float32) and its error is rounding-sized: nonzero, and small."""
    q, k, v, dout, opts = make_case(CONFIGS[-1].values[0])
    q, k, v, dout = (t.to(dtype) for t in (q, k, v, dout))
    gold = attention_reference(q, k, v, dout, opts, F64)
    low = attention_reference(q, k, v, dout, opts, dtype)
    assert low.out.dtype == dtype and low.dq.dtype == dtype and low.lse.dtype == torch.float32
    eps = torch.finfo(dtype).eps
    for name in ("out", "dq", "dk", "dv"):
        err = float((low.tensors()[name].double() - gold.tensors()[name]).abs().max())
        scale = float(gold.tensors()[name].abs().max())
        assert 0 < err < 64 * eps * scale, f"{name}: error {err:.3g} vs scale {scale:.3g}"


def test_forward_only_reference_gives_the_same_out_and_lse_without_gradients():
    """backward=False (the float32 LSE yardstick, decode steps) skips only the backward: out and LSE
    are bit-identical to the full reference's, dense and varlen."""
    import torch

    from gate.attention.reference import AttnOptions, attention_reference

    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 70, 4, 32, generator=gen) for _ in range(4))
    opts = AttnOptions(softmax_scale=32**-0.5, causal=True, window=(-1, -1), softcap=20.0)
    full = attention_reference(q, k, v, do, opts, torch.float32)
    fwd = attention_reference(q, k, v, do, opts, torch.float32, backward=False)
    assert torch.equal(full.out, fwd.out) and torch.equal(full.lse, fwd.lse)
    assert fwd.dq is None and set(fwd.tensors()) == {"out", "lse"}
    cu = torch.tensor([0, 30, 70])
    packed = [t.reshape(140, 4, 32)[:70] for t in (q, k, v, do)]
    full = attention_reference(*packed, opts, torch.float32, cu_seqlens=cu)
    fwd = attention_reference(*packed, opts, torch.float32, cu_seqlens=cu, backward=False)
    assert torch.equal(full.out, fwd.out) and torch.equal(full.lse, fwd.lse) and fwd.dk is None


SETTERS = {
    "legacy medium": lambda: torch.set_float32_matmul_precision("medium"),
    "legacy allow_tf32": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    "global tf32": lambda: setattr(torch.backends, "fp32_precision", "tf32"),
    "oneDNN bf16": lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
    "fp16 accumulation": lambda: setattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", True),
}


def in_a_fork(body, limit: float = 120.0) -> None:
    """`body()` in a forked child: what it sets in torch's process-wide matmul settings dies with it
    (torch cannot put back "inherit the global precision" through its older API). A failed assert,
    a crash, an early exit or a hang of the child fails this test."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's teardown
        message = b"the child stopped before reporting"
        try:
            os.close(read)
            body()
            message = b""
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
            message = f"{type(exc).__name__}: {exc}".encode()
        finally:
            try:
                os.write(write, message)
            finally:
                os._exit(1 if message else 0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], limit)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode() if ready else f"the child ran past {limit:.0f} s"
    _, status = os.waitpid(pid, 0)
    assert not message, message
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child ended with status {status}"


def _settings() -> tuple:
    m = torch.backends.cuda.matmul
    return (m.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision, m.allow_fp16_accumulation)


@pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9 keeps one float32 matmul precision"
)
@pytest.mark.parametrize("setting", SETTERS)
def test_the_yardstick_runs_at_torchs_default_matmul_precision_whatever_the_kernel_set(setting):
    """A kernel's package that turns on TF32 or bf16 passes for float32 matmuls (or fp16
    accumulation) does not move the bound: the low-precision reference runs at the defaults, and the
    package's setting is back afterwards, a backend that inherited the global precision inheriting it
    still."""
    q, k, v, dout, opts = make_case(CONFIGS[-1].values[0])
    q, k, v, dout = (t.float() for t in (q, k, v, dout))
    default = attention_reference(q, k, v, dout, opts, torch.float32)

    def body():
        SETTERS[setting]()
        theirs = _settings()
        seen = []
        real = gate.attention.reference.allowed_mask
        gate.attention.reference.allowed_mask = lambda *a, **kw: seen.append(_settings()) or real(*a, **kw)
        low = attention_reference(q, k, v, dout, opts, torch.float32)
        assert seen and set(seen) == {("ieee", "ieee", False)}, seen
        assert _settings() == theirs, (_settings(), theirs)
        for name, t in low.tensors().items():
            assert torch.equal(t, default.tensors()[name]), name
        if setting == "global tf32":  # a backend that inherited the global precision inherits it still
            torch.backends.fp32_precision = "ieee"
            assert _settings()[:2] == ("ieee", "ieee"), _settings()

    in_a_fork(body)
