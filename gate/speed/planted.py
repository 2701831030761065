"""Planted slowdowns for `attn-gate selftest`: a kernel made slower by a real GPU-side delay.

`torch.cuda._sleep(cycles)` enqueues a kernel that spins for that many clock cycles, in the same
stream as the attention kernel, so the engine times it exactly as it would time a slower kernel
(events, cold L2, launch shield all unchanged). The forward delay follows the kernel's forward
launch; the backward delay runs when the gradient reaches the output, inside the timed backward.
Calibration: cycles per millisecond are measured with CUDA events (gate.speed.timing.
sleep_cycles_per_ms), and a planted level L% of a pass is L/100 x that pass's own measured median
time (from the in-run baseline) in cycles. The delay is one extra kernel launch, so the measured
shift can exceed the nominal one on short passes: the selftest reports the measured shift.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from gate.kernels.base import DelegatingAdapter, KernelAdapter, KernelCall, KernelOutput


def spin(cycles: int, on_gpu: bool) -> None:
    """A real delay in the pass: torch.cuda._sleep in the stream on a GPU; on a CPU (the rehearsal
    of the plumbing only) a busy-wait of `cycles` nanoseconds."""
    if on_gpu:
        torch.cuda._sleep(cycles)
        return
    end = time.perf_counter_ns() + cycles
    while time.perf_counter_ns() < end:
        pass


CPU_CYCLES_PER_MS = 1e6  # the CPU rehearsal's "cycle" is a nanosecond of busy-wait


class _SleepInBackward(torch.autograd.Function):
    """Identity forward; the backward spins `cycles` on the GPU before passing the gradient on."""

    @staticmethod
    def forward(ctx, x, cycles):
        ctx.cycles = cycles
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        spin(ctx.cycles, grad.is_cuda)
        return grad, None


class SlowedKernel(DelegatingAdapter):
    """The inner adapter with `fwd_cycles` / `bwd_cycles` of GPU sleep added to its passes."""

    def __init__(self, inner: KernelAdapter, fwd_cycles: int = 0, bwd_cycles: int = 0):
        super().__init__(
            inner, f"{inner.description} + planted delay (fwd {int(fwd_cycles)}, bwd {int(bwd_cycles)} cycles)"
        )
        self.fwd_cycles, self.bwd_cycles = int(fwd_cycles), int(bwd_cycles)

    def __call__(self, call: KernelCall) -> KernelOutput:
        res = self.inner(call)
        out = res.out
        if self.fwd_cycles:
            spin(self.fwd_cycles, out.is_cuda)
        if self.bwd_cycles:
            out = _SleepInBackward.apply(out, self.bwd_cycles)
        return dataclasses.replace(res, out=out)


def planted_cycles(level_pct: float, pass_ms: float, cycles_per_ms: float) -> int:
    """Cycles of sleep that add `level_pct` percent to a pass that takes `pass_ms`."""
    return max(0, int(round(level_pct / 100.0 * pass_ms * cycles_per_ms)))


class RepeatedKernel(DelegatingAdapter):
    """The inner kernel run `times` times per call, the extra outputs joined with weight zero, so
    its backward does `times` x the real work (the forward too). A slower kernel for a shared CPU:
    the extra work is slowed by the other users' load as the kernel itself is, where a fixed
    busy-wait calibrated once becomes a smaller share of a pass whenever the load grows."""

    def __init__(self, inner: KernelAdapter, times: int):
        if times < 1:
            raise ValueError(f"times {times} must be >= 1")
        super().__init__(inner, f"{inner.description} x{times} (planted repeated work)")
        self.times = int(times)

    def __call__(self, call: KernelCall) -> KernelOutput:
        res = self.inner(call)
        out = res.out
        for _ in range(self.times - 1):
            out = out + 0.0 * self.inner(call).out  # zero weight: same values, the extra backward still runs
        return dataclasses.replace(res, out=out)
