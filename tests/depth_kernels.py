"""Planted-bug kernels for the depth checks: `tiled` (correct) with one realistic bug each.

Each bug is chosen so the plain error ratio cannot see it (or cannot see all of it): the check
under test has to be what catches it.
"""

from __future__ import annotations

import dataclasses

import torch

from gate.correctness.planted import ScaleGrad  # identity forward, scaled gradient
from gate.kernels.base import Capabilities, KernelCall, KernelOutput
from gate.kernels.tiled import TiledAdapter, dropout_keep_mask, tiled_attention


class _LastBitJitter(torch.autograd.Function):
    """Identity forward; the backward flips the last bit of one element of the gradient, picked
    with the global RNG: the signature of a race (an unordered atomic add) in dQ."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[grad.element_size()]
        flat = grad.view(-1).view(ints)
        i = int(torch.randint(flat.numel(), (1,)))
        flat[i] ^= 1
        return grad


class RacyTiled(TiledAdapter):
    """Claims a deterministic mode, but dQ differs in its last bit from run to run."""

    name = "racy-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        return super().__call__(dataclasses.replace(call, q=_LastBitJitter.apply(call.q)))


class RacyTiledNoClaim(RacyTiled):
    """The same race in a kernel that does not claim determinism: reported, not judged."""

    name = "racy-tiled-no-claim"

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), deterministic_mode=False)


class BatchCoupledTiled(TiledAdapter):
    """An 'overflow guard' that divides q by its max over the WHOLE batch (and multiplies the
    softmax scale back): exact in real numbers, but q/s rounds differently when the neighbours
    change s, so a sequence's result depends on the other sequences by a few ulps."""

    name = "batch-coupled-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        s = float(call.q.detach().float().abs().amax()) * 1.37  # not a power of two: the rounding moves
        q = (call.q.float() / s).to(call.q.dtype)
        opts = dataclasses.replace(call.opts, softmax_scale=call.opts.softmax_scale * s)
        # The re-rounded q moves its LSE by ~3e-3 in bf16, which the float32 LSE yardstick
        # fails by itself; the LSE is withheld so that batch invariance is what must catch it.
        return dataclasses.replace(super().__call__(dataclasses.replace(call, q=q, opts=opts)), lse=None)


def _dense_keep(call: KernelCall, p: float, seed: int) -> torch.Tensor:
    b, nq, hq, _ = call.q.shape
    return dropout_keep_mask((b, hq, nq, call.k.shape[1]), p, seed, call.q.device)


class WrongRescaleTiled(TiledAdapter):
    """Drops with probability p but rescales the kept ones by 1/(1 - p/2) instead of 1/(1 - p)."""

    name = "wrong-rescale-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        p = call.opts.dropout_p
        keep = _dense_keep(call, p, call.seed)
        wrong = dataclasses.replace(call.opts, dropout_p=p / 2)
        out, lse = tiled_attention(call.q, call.k, call.v, wrong, keep)
        return KernelOutput(out=out, lse=lse, dropout_keep=keep)


class NewMaskBackwardTiled(TiledAdapter):
    """The forward uses the seeded mask (and exposes it); the backward draws a fresh one from
    the global RNG instead of replaying the forward's."""

    name = "new-mask-backward-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        p = call.opts.dropout_p
        keep = _dense_keep(call, p, call.seed)
        fresh = torch.rand(keep.shape) >= p
        with torch.no_grad():
            out_fwd, lse = tiled_attention(call.q, call.k, call.v, call.opts, keep)
        out_bwd, _ = tiled_attention(call.q, call.k, call.v, call.opts, fresh.to(keep.device))
        return KernelOutput(out=out_bwd + (out_fwd - out_bwd).detach(), lse=lse, dropout_keep=keep)


class WrongRateTiled(TiledAdapter):
    """Draws its mask with p + 0.05 (and says so honestly through the mask): every element is
    computed right for the mask it used, only the rate is wrong."""

    name = "wrong-rate-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        keep = _dense_keep(call, call.opts.dropout_p + 0.05, call.seed)
        out, lse = tiled_attention(call.q, call.k, call.v, call.opts, keep)
        return KernelOutput(out=out, lse=lse, dropout_keep=keep)


class FixedMaskTiled(TiledAdapter):
    """Ignores the seed: the same mask for every call."""

    name = "fixed-mask-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        return super().__call__(dataclasses.replace(call, seed=1234))


class DriftingTiled(TiledAdapter):
    """Forward exact; dQ and dK come back at half size (a factor lost in the backward): every step
    is still a descent direction, so training runs, but it learns late and the loss curve leaves
    the reference band (measured on CPU, 3 seeds: 3.5-10x outside it; tiled uses 0.1-0.3 of it)."""

    name = "drifting-tiled"

    def __call__(self, call: KernelCall) -> KernelOutput:
        q, k = ScaleGrad.apply(call.q, 0.5), ScaleGrad.apply(call.k, 0.5)
        return super().__call__(dataclasses.replace(call, q=q, k=k))
