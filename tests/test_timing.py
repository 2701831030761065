"""The timing engine on the CPU: call order, derived statistics on synthetic samples, the raw
samples it keeps, the matmul anchor's FLOPs, GPU-state flags. Never asserts on measured speed."""

import math

import pytest

from gate.core.cases import Case
from gate.speed.timing import (
    CpuClock,
    GpuState,
    MatmulWorkload,
    PassTiming,
    TimingPlan,
    TimingRun,
    Workload,
    throttle_names,
    time_pair,
)


class FunctionWorkload(Workload):
    """Plain callables: the engine's call order, observable."""

    def __init__(self, name, fwd, bwd):
        self.name, self._fns = name, {"fwd": fwd, "bwd": bwd}

    def run(self, pass_):
        return self._fns[pass_]()


TINY = Case.build(
    batch=1, seqlen_q=32, seqlen_k=32, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="fp32", perf=True
)


def test_rounds_interleave_candidate_and_anchor_per_pass():
    log = []
    cand = FunctionWorkload("A", lambda: log.append("A-fwd"), lambda: log.append("A-bwd"))
    anchor = FunctionWorkload("B", lambda: log.append("B-fwd"), lambda: log.append("B-bwd"))
    plan = TimingPlan(rounds=3, calls_per_round=2, warmup_s=0.0)
    run = time_pair(cand, anchor, plan, "cpu")
    timed = log[-3 * 8 :]  # after warm-up and the memory probe: 3 rounds x (2 passes x 2 kernels x 2 calls)
    one_round = ["A-fwd", "A-fwd", "B-fwd", "B-fwd", "A-bwd", "A-bwd", "B-bwd", "B-bwd"]
    assert timed == one_round * 3
    assert run.method == "perf_counter"
    for p in run.passes:
        assert len(p.candidate_ms) == 3 and all(len(r) == 2 for r in p.candidate_ms)
        assert all(x >= 0 for r in p.candidate_ms + p.anchor_ms for x in r)


def test_only_requested_passes_are_timed():
    log = []
    cand = FunctionWorkload("A", lambda: log.append("A-fwd"), lambda: log.append("A-bwd"))
    anchor = FunctionWorkload("B", lambda: log.append("B-fwd"), lambda: log.append("B-bwd"))
    run = time_pair(cand, anchor, TimingPlan(rounds=2, calls_per_round=1, warmup_s=0.0, passes=("bwd",)), "cpu")
    assert [p.pass_ for p in run.passes] == ["bwd"]
    assert log[-4:] == ["A-bwd", "B-bwd", "A-bwd", "B-bwd"]


def test_pass_statistics_from_synthetic_samples():
    # candidate rounds: medians 2, 4, 6, 8, 10, 12 ms; anchor rounds 1 ms -> ratios 2..12
    cand = tuple((m - 0.5, m, m + 9.0) for m in (2.0, 4.0, 6.0, 8.0, 10.0, 12.0))
    anchor = tuple((1.0, 1.0, 0.5) for _ in range(6))
    p = PassTiming("fwd", cand, anchor)
    assert p.candidate_round_ms == (2.0, 4.0, 6.0, 8.0, 10.0, 12.0)
    assert p.ratios == (2.0, 4.0, 6.0, 8.0, 10.0, 12.0)
    assert p.speed_ratio == 7.0
    assert p.ratio_ci == (2.0, 12.0)  # n = 6: the extremes cover the median with 96.9%
    assert p.noise == pytest.approx(math.sqrt(math.pi / 2) * 1.4826 * 3.0 / math.sqrt(6) / 7.0)
    assert p.anchor_median_ms == 1.0
    scaled = PassTiming("fwd", cand, anchor, anchor_scale=2.0)
    assert scaled.speed_ratio == 3.5  # the matmul anchor's FLOP correction applies to the anchor time


def test_timing_run_round_trips_and_flags_throttling():
    state = GpuState(
        sm_clock_mhz=1980, mem_clock_mhz=3201, temperature_c=50, power_w=400, throttle_reasons=throttle_names(0x4 | 0x1)
    )
    assert state.throttle_reasons == ("gpu_idle", "sw_power_cap") and state.throttled
    assert not GpuState(throttle_reasons=throttle_names(0x1)).throttled  # idle is not throttling
    run = TimingRun(
        method="cuda-events",
        plan=TimingPlan(rounds=1, calls_per_round=1),
        passes=(PassTiming("fwd", ((1.0,),), ((2.0,),)),),
        gpu_start=GpuState(),
        gpu_end=state,
        peak_mem_mb={"candidate": 3.0, "anchor": 4.0},
    )
    assert run.throttled
    assert TimingRun.from_dict(run.to_dict()).to_dict() == run.to_dict()


def test_matmul_anchor_matches_the_case_flops():
    mm = MatmulWorkload(TINY, "cpu")
    for p in ("fwd", "bwd"):
        assert mm.time_scale(p) == pytest.approx(TINY.flops(p) / mm.matmul_flops(p))
        assert 0.5 < mm.time_scale(p) < 2.0
    mm.prepare()
    assert tuple(mm.run("fwd").shape) == mm.shapes["fwd"][:2]


def test_real_kernels_on_cpu_keep_raw_samples_and_reset_grads():
    from gate.kernels.registry import get_adapter
    from gate.speed.runs import measure_case

    plan = TimingPlan(rounds=3, calls_per_round=2, warmup_s=0.0)
    result = measure_case(get_adapter("tiled"), "sdpa-math", TINY, "cpu", plan)
    assert result.label == "OK", result.reason
    for p in ("fwd", "bwd"):
        t = result.pass_timing(p)
        assert t.rounds == 3 and len(t.ratios) == 3 and all(r > 0 for r in t.ratios)
        assert result.tflops(p) > 0
    assert result.timing.gpu_start.error == "no GPU"


def test_backward_alone_does_not_accumulate_grads():
    from gate.kernels.registry import get_adapter
    from gate.speed.timing import KernelWorkload

    w = KernelWorkload(get_adapter("sdpa-math"), TINY, "cpu")
    w.prepare()
    grads = [w.run("bwd") for _ in range(3)]
    assert w.call.q.grad is None  # autograd.grad on the retained graph: nothing piles up in .grad
    assert all(g[0].shape == w.call.q.shape for g in grads)


def test_a_crashing_kernel_is_an_error_row():
    from gate.kernels.registry import get_adapter
    from gate.speed.runs import measure_case

    adapter = get_adapter("tiled")

    class Broken(type(adapter)):
        def __call__(self, call):
            raise RuntimeError("boom")

    result = measure_case(Broken(), "sdpa-math", TINY, "cpu", TimingPlan(rounds=1, calls_per_round=1, warmup_s=0.0))
    assert result.status == "ERROR" and "boom" in result.reason


def test_a_backward_that_cannot_run_twice_names_the_compile_setting():
    """torch.compile may donate a backward's saved buffers; timing runs the backward of one graph
    again and again, and the ERROR row names the setting that allows it (FlexAttention on an H200)."""
    import torch

    from gate.kernels.base import KernelOutput
    from gate.kernels.registry import get_adapter
    from gate.speed.runs import measure_case
    from gate.speed.timing import DONATED_BUFFERS_HINT

    class Donated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q * 1.0

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError(
                "This backward function was compiled with non-empty donated buffers which requires "
                "create_graph=False and retain_graph=False."
            )

    adapter = get_adapter("tiled")

    class Compiled(type(adapter)):
        def __call__(self, call):
            return KernelOutput(out=Donated.apply(call.q, call.k, call.v))

    result = measure_case(Compiled(), "sdpa-math", TINY, "cpu", TimingPlan(rounds=1, calls_per_round=1, warmup_s=0.0))
    assert result.status == "ERROR" and result.reason.endswith(DONATED_BUFFERS_HINT)


def test_flex_compiles_without_donated_buffers():
    """The flex adapter turns donated buffers off before it compiles, so its backward can be timed."""
    import torch._functorch.config as functorch_config

    from gate.kernels.registry import get_adapter

    was = functorch_config.donated_buffer
    try:
        functorch_config.donated_buffer = True
        get_adapter("flex")._fn()
        assert functorch_config.donated_buffer is False
    finally:
        functorch_config.donated_buffer = was


def test_cpu_clock_returns_one_sample_per_call():
    assert len(CpuClock().time_calls(lambda: None, 4)) == 4
