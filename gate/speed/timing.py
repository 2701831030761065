"""The one timing engine: a candidate and an anchor timed side by side, forward and backward apart.

Absolute times drift with clocks and heat; a ratio measured in one process, with the two kernels
interleaved round by round, does not. Per round and pass the candidate runs `calls_per_round`
timed calls, then the anchor does (A B A B ...); a round's time is the median of its calls and
the round's speed ratio is candidate / anchor. Raw per-call samples are kept; medians, CIs and
noise are derived (gate/speed/stats.py), never stored twice.

On a GPU each timed call is bracketed by CUDA events and preceded, outside the events, by
  * an L2 flush (writing a buffer larger than L2) so every call starts cold, as in training, and
  * a `torch.cuda._sleep` "launch shield" longer than the call's host-side launch time, so the
    whole call is queued before the start event fires and CPU launch jitter (autograd's backward
    launches several kernels) stays out of the measurement.
Forward is timed as training runs it (inputs require grad, graph built and dropped); backward
alone, on a graph built once and retained, with `torch.autograd.grad` so nothing accumulates
into `.grad`. GPU state (clocks, temperature, power, throttle reasons; nvidia-ml-py) is read at
the start and the end of every run, and a run that throttled says so.

Without a GPU the same loop runs with `time.perf_counter` (no flush, no shield) so every path
runs in CI; CPU numbers are history, not a gate.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gate.speed import stats as perf_stats
from gate.speed.rule import RatioEstimate

PASSES = ("fwd", "bwd")

# nvmlClocksEventReasons bits (nvml.h); the ones in THROTTLING mean the clocks were held down.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THROTTLING = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)


@dataclass(frozen=True)
class TimingPlan:
    rounds: int = 15
    calls_per_round: int = 5
    warmup_s: float = 0.5
    cold_l2: bool = True
    passes: tuple[str, ...] = PASSES
    launch_shield: bool = True

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.calls_per_round < 1:
            raise ValueError("rounds and calls_per_round must be >= 1")
        if not self.passes or any(p not in PASSES for p in self.passes):
            raise ValueError(f"passes must be a non-empty subset of {PASSES}")

    @classmethod
    def from_config(cls, perf_config, rounds: int | None = None, passes: tuple[str, ...] = PASSES) -> "TimingPlan":
        return cls(
            rounds=rounds or perf_config.rounds,
            calls_per_round=perf_config.calls_per_round,
            warmup_s=perf_config.warmup_s,
            cold_l2=perf_config.cold_l2,
            passes=passes,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passes": list(self.passes)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TimingPlan":
        return cls(**{**d, "passes": tuple(d["passes"])})


@dataclass(frozen=True)
class GpuState:
    """One nvidia-ml-py reading. `error` says why fields are missing (no NVML, no GPU)."""

    sm_clock_mhz: float = math.nan
    mem_clock_mhz: float = math.nan
    temperature_c: float = math.nan
    power_w: float = math.nan
    throttle_reasons: tuple[str, ...] = ()
    error: str = ""

    @property
    def throttled(self) -> bool:
        return bool(THROTTLING.intersection(self.throttle_reasons))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "throttle_reasons": list(self.throttle_reasons)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GpuState":
        floats = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")
        return cls(
            **{k: float(d[k]) for k in floats},
            throttle_reasons=tuple(d.get("throttle_reasons", ())),
            error=d.get("error", ""),
        )


def throttle_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in sorted(THROTTLE_BITS.items()) if mask & bit)


def _nvml_handle(pynvml, torch_index: int):
    """The NVML handle of torch's device `torch_index` (by UUID: CUDA_VISIBLE_DEVICES renumbers)."""
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(torch_index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        return pynvml.nvmlDeviceGetHandleByIndex(torch_index)


def read_gpu_state(torch_index: int = 0) -> GpuState:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: recorded, not fatal
        return GpuState(error=f"nvml unavailable: {type(exc).__name__}: {exc}"[:200])
    try:
        h = _nvml_handle(pynvml, torch_index)
        reasons_fn = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return GpuState(
            sm_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
            mem_clock_mhz=float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            temperature_c=float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
            power_w=pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            throttle_reasons=throttle_names(int(reasons_fn(h))),
        )
    except Exception as exc:
        return GpuState(error=f"nvml query failed: {type(exc).__name__}: {exc}"[:200])
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


@dataclass(frozen=True)
class PassTiming:
    """Raw samples of one pass: [round][call] milliseconds for candidate and anchor.

    `anchor_scale` multiplies anchor times before the ratio (1 for a kernel anchor; for the
    matmul anchor, case FLOPs / matmul FLOPs, so the ratio is against exactly equal FLOPs).
    """

    pass_: str
    candidate_ms: tuple[tuple[float, ...], ...]
    anchor_ms: tuple[tuple[float, ...], ...]
    anchor_scale: float = 1.0

    @property
    def rounds(self) -> int:
        return len(self.candidate_ms)

    @property
    def candidate_round_ms(self) -> tuple[float, ...]:
        return tuple(perf_stats.median(r) for r in self.candidate_ms)

    @property
    def anchor_round_ms(self) -> tuple[float, ...]:
        return tuple(perf_stats.median(r) * self.anchor_scale for r in self.anchor_ms)

    @property
    def ratios(self) -> tuple[float, ...]:
        """Per-round speed ratios: each candidate round against the anchor round beside it."""
        return tuple(c / a for c, a in zip(self.candidate_round_ms, self.anchor_round_ms))

    @property
    def candidate_median_ms(self) -> float:
        return perf_stats.median([x for r in self.candidate_ms for x in r])

    @property
    def anchor_median_ms(self) -> float:
        return perf_stats.median([x for r in self.anchor_ms for x in r]) * self.anchor_scale

    @property
    def speed_ratio(self) -> float:
        return perf_stats.median(self.ratios)

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return perf_stats.median_ci(self.ratios)

    @property
    def noise(self) -> float:
        return perf_stats.median_rel_se(self.ratios)

    @property
    def spread(self) -> float:
        """IQR/median of the per-round ratios (> 0.1: a noisy measurement)."""
        return perf_stats.relative_spread(self.ratios)

    def estimate(self) -> RatioEstimate:
        return RatioEstimate.from_samples(self.ratios)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.pass_,
            "candidate_ms": [list(r) for r in self.candidate_ms],
            "anchor_ms": [list(r) for r in self.anchor_ms],
            "anchor_scale": self.anchor_scale,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PassTiming":
        return cls(
            pass_=d["pass"],
            candidate_ms=tuple(tuple(map(float, r)) for r in d["candidate_ms"]),
            anchor_ms=tuple(tuple(map(float, r)) for r in d["anchor_ms"]),
            anchor_scale=float(d.get("anchor_scale", 1.0)),
        )


@dataclass(frozen=True)
class TimingRun:
    method: str  # "cuda-events" or "perf_counter"
    plan: TimingPlan
    passes: tuple[PassTiming, ...]
    gpu_start: GpuState = field(default_factory=GpuState)
    gpu_end: GpuState = field(default_factory=GpuState)
    peak_mem_mb: dict[str, float] = field(default_factory=dict)
    shield_ms: float = 0.0
    l2_flush_mb: float = 0.0
    wall_s: float = 0.0

    def pass_timing(self, pass_: str) -> PassTiming | None:
        return next((p for p in self.passes if p.pass_ == pass_), None)

    @property
    def throttled(self) -> bool:
        return self.gpu_start.throttled or self.gpu_end.throttled

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "plan": self.plan.to_dict(),
            "passes": [p.to_dict() for p in self.passes],
            "gpu_start": self.gpu_start.to_dict(),
            "gpu_end": self.gpu_end.to_dict(),
            "peak_mem_mb": self.peak_mem_mb,
            "shield_ms": self.shield_ms,
            "l2_flush_mb": self.l2_flush_mb,
            "wall_s": round(self.wall_s, 3),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TimingRun":
        return cls(
            method=d["method"],
            plan=TimingPlan.from_dict(d["plan"]),
            passes=tuple(PassTiming.from_dict(p) for p in d["passes"]),
            gpu_start=GpuState.from_dict(d["gpu_start"]),
            gpu_end=GpuState.from_dict(d["gpu_end"]),
            peak_mem_mb={k: float(v) for k, v in d.get("peak_mem_mb", {}).items()},
            shield_ms=float(d.get("shield_ms", 0.0)),
            l2_flush_mb=float(d.get("l2_flush_mb", 0.0)),
            wall_s=float(d.get("wall_s", 0.0)),
        )


# --------------------------------------------------------------------------------------------
# What is timed


class Workload:
    """Something with a forward and a backward to time. `prepare` builds inputs and the retained
    graph; `run(pass_)` is one call; `probe` runs one fresh fwd+bwd (for peak memory)."""

    name = "workload"

    def prepare(self) -> None:
        pass

    def run(self, pass_: str) -> Any:
        raise NotImplementedError

    def probe(self) -> None:
        for p in PASSES:
            self.run(p)

    def time_scale(self, pass_: str) -> float:
        return 1.0


# torch.compile's AOT autograd may free ("donate") saved buffers in the backward; a graph whose
# buffers were donated cannot be run backward twice, and timing reuses one graph for every backward.
DONATED_BUFFERS_HINT = (
    "the kernel's backward was compiled with donated buffers, which forbid the repeated backward over one graph "
    "that timing runs (retain_graph=True): set torch._functorch.config.donated_buffer = False before it compiles"
)


class KernelWorkload(Workload):
    """An adapter on a case's inputs (seed 0), as training calls it."""

    def __init__(self, adapter, case, device: str, inputs=None):
        self.adapter, self.case, self.device = adapter, case, device
        self.name = adapter.name
        self.inputs = inputs  # AttnInputs to share (candidate and anchor see the same values)
        self._prepared = False

    def prepare(self) -> None:
        """Idempotent: inputs and the retained graph are built once per workload."""
        if self._prepared:
            return
        import torch

        from gate.attention.inputs import timing_inputs
        from gate.correctness.run_case import leaf_call

        self.adapter.prepare(self.case)
        if self.inputs is None:
            self.inputs = timing_inputs(self.case, self.device)
        self.call = dataclasses.replace(leaf_call(self.case, self.inputs), want_lse=False)
        self._leaves = (self.call.q, self.call.k, self.call.v)
        # decode cases and forward-only kernels have no backward to build or time
        self.forward_only = self.case.forward_only or not self.adapter.capabilities().backward
        if self.forward_only:
            self._grad = None
            self._prepared = True
            return
        if self.case.bias.grad:  # the backward of a trainable bias computes dBias too
            self._leaves += (self.call.opts.bias,)
        self._out = self.adapter(self.call).out  # the graph every backward call reuses
        self._grad = torch.autograd.grad
        self._prepared = True

    def run(self, pass_: str) -> Any:
        if pass_ == "fwd":
            return self.adapter(self.call).out
        try:
            return self._grad(self._out, self._leaves, self.inputs.dout, retain_graph=True)
        except RuntimeError as exc:
            if "donated buffers" not in str(exc):
                raise
            raise RuntimeError(DONATED_BUFFERS_HINT) from exc

    def probe(self) -> None:
        import torch

        out = self.adapter(self.call).out
        if not self.forward_only:
            torch.autograd.grad(out, self._leaves, self.inputs.dout)


class MatmulWorkload(Workload):
    """A dense matmul of (about) the case's FLOPs per pass, in the case dtype: the chip's GEMM rate.

    Sizes m = n ~ (F/2)^(1/3) rounded to 64, k chosen to match F; `time_scale` corrects the small
    rounding so the ratio is against exactly equal FLOPs. 1 / speed_ratio is then the kernel's
    efficiency against dense GEMM.
    """

    name = "matmul"

    def __init__(self, case, device: str):
        self.case, self.device = case, device
        self.shapes: dict[str, tuple[int, int, int]] = {}
        for p in PASSES:
            target = case.flops(p)
            m = max(64, int(round((target / 2) ** (1 / 3) / 64)) * 64)
            k = max(8, int(round(target / (2 * m * m) / 8)) * 8)
            self.shapes[p] = (m, m, k)

    def prepare(self) -> None:
        if getattr(self, "_ab", None) is not None:
            return
        import torch

        from gate.attention.inputs import TORCH_DTYPES

        dtype = TORCH_DTYPES[self.case.compute_dtype]
        gen = torch.Generator(device="cpu").manual_seed(0)
        self._ab = {}
        for p, (m, n, k) in self.shapes.items():
            a = torch.randn(m, k, generator=gen).to(self.device, dtype)
            b = torch.randn(k, n, generator=gen).to(self.device, dtype)
            self._ab[p] = (a, b)

    def run(self, pass_: str) -> Any:
        a, b = self._ab[pass_]
        return a @ b

    def matmul_flops(self, pass_: str) -> float:
        m, n, k = self.shapes[pass_]
        return 2.0 * m * n * k

    def time_scale(self, pass_: str) -> float:
        return self.case.flops(pass_) / self.matmul_flops(pass_)


# --------------------------------------------------------------------------------------------
# Clocks


class CpuClock:
    method = "perf_counter"
    shield_ms = 0.0
    l2_flush_mb = 0.0

    def sync(self) -> None:
        pass

    def host_ms(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def time_calls(self, fn: Callable[[], Any], n: int) -> tuple[float, ...]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return tuple(out)

    def peak_mem_mb(self, probe: Callable[[], Any]) -> float:
        return math.nan  # torch's CPU allocator keeps no peak statistics


def sleep_cycles_per_ms(samples: int = 3, cycles: int = 500_000) -> float:
    """How many `torch.cuda._sleep` cycles make a millisecond on this GPU, measured with events."""
    import torch

    times = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return cycles / perf_stats.median(times)


class CudaClock:
    method = "cuda-events"

    def __init__(self, cold_l2: bool, launch_shield: bool):
        import torch

        self.torch = torch
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.flush = torch.empty(max(2 * l2, 64 * 2**20) // 4, dtype=torch.int32, device="cuda") if cold_l2 else None
        self.l2_flush_mb = 0.0 if self.flush is None else self.flush.numel() * 4 / 2**20
        self.cycles_per_ms = sleep_cycles_per_ms() if launch_shield else 0.0
        self.shield_ms = 0.0
        self.launch_shield = launch_shield

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def host_ms(self, fn: Callable[[], Any]) -> float:
        """Host-side launch time of one call (the GPU is kept busy so launches do not block)."""
        if self.flush is not None:
            self.flush.zero_()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def set_shield(self, host_ms: float) -> None:
        if self.launch_shield:
            self.shield_ms = min(5.0, 1.5 * host_ms + 0.02)

    def time_calls(self, fn: Callable[[], Any], n: int) -> tuple[float, ...]:
        torch = self.torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        shield_cycles = int(self.shield_ms * self.cycles_per_ms)
        for start, end in events:
            if self.flush is not None:
                self.flush.zero_()
            if shield_cycles:
                torch.cuda._sleep(shield_cycles)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return tuple(start.elapsed_time(end) for start, end in events)

    def peak_mem_mb(self, probe: Callable[[], Any]) -> float:
        return cuda_peak_mem_mb(probe)


def cuda_peak_mem_mb(probe: Callable[[], Any]) -> float:
    """Peak GPU memory of one fresh fwd+bwd above what was allocated before it (inputs excluded)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    probe()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def workload_peak_mem_mb(workload: Workload, device: str) -> float:
    """Peak memory of one fwd+bwd of a workload alone (NaN on the CPU: no allocator statistics)."""
    if device != "cuda":
        return math.nan
    workload.prepare()
    return cuda_peak_mem_mb(workload.probe)


def make_clock(device: str, plan: TimingPlan):
    return CudaClock(plan.cold_l2, plan.launch_shield) if device == "cuda" else CpuClock()


# --------------------------------------------------------------------------------------------
# The loop


def warm_up(clock, workloads: tuple[Workload, ...], passes: tuple[str, ...], seconds: float) -> float:
    """Run every workload and pass until `seconds` have passed (at least once each); returns the
    largest median host-side launch time seen (the launch shield is sized from it)."""
    host: dict[tuple[str, str], list[float]] = {}
    t0 = time.perf_counter()
    while True:
        for i, w in enumerate(workloads):
            for p in passes:
                host.setdefault((str(i), p), []).append(clock.host_ms(lambda: w.run(p)))
        clock.sync()
        if time.perf_counter() - t0 >= seconds:
            break
    return max(perf_stats.median(v[len(v) // 2 :]) for v in host.values())


def time_pair(
    candidate: Workload,
    anchor: Workload,
    plan: TimingPlan,
    device: str,
    clock=None,
    gpu_state: Callable[[], GpuState] | None = None,
) -> TimingRun:
    """Time `candidate` against `anchor`, interleaved: per round and pass, candidate then anchor."""
    if device != "cuda":
        with _one_cpu_thread():
            return _time_pair(candidate, anchor, plan, device, clock, gpu_state)
    return _time_pair(candidate, anchor, plan, device, clock, gpu_state)


class _one_cpu_thread:
    """torch's intra-op threads set to 1 while CPU timings are taken (torch.utils.benchmark.Timer's
    default too): on a shared machine a multi-threaded op waits for its slowest thread, so its time
    follows the load of the other cores and a candidate/anchor ratio drifts with it (seen on a
    2-core box: an unchanged kernel's backward ratio read -46% .. +3% between runs)."""

    def __enter__(self):
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.threads)


def _time_pair(
    candidate: Workload,
    anchor: Workload,
    plan: TimingPlan,
    device: str,
    clock,
    gpu_state: Callable[[], GpuState] | None,
) -> TimingRun:
    t0 = time.perf_counter()
    clock = clock or make_clock(device, plan)
    if gpu_state is None:
        gpu_state = read_gpu_state if device == "cuda" else (lambda: GpuState(error="no GPU"))
    start_state = gpu_state()
    for w in (candidate, anchor):
        w.prepare()
    peak = {"candidate": clock.peak_mem_mb(candidate.probe), "anchor": clock.peak_mem_mb(anchor.probe)}
    host_ms = warm_up(clock, (candidate, anchor), plan.passes, plan.warmup_s)
    if hasattr(clock, "set_shield"):
        clock.set_shield(host_ms)
    samples: dict[str, dict[str, list]] = {p: {"candidate": [], "anchor": []} for p in plan.passes}
    for _ in range(plan.rounds):
        for p in plan.passes:
            for label, w in (("candidate", candidate), ("anchor", anchor)):
                samples[p][label].append(clock.time_calls(lambda w=w, p=p: w.run(p), plan.calls_per_round))
    end_state = gpu_state()
    passes = tuple(
        PassTiming(p, tuple(samples[p]["candidate"]), tuple(samples[p]["anchor"]), anchor.time_scale(p))
        for p in plan.passes
    )
    return TimingRun(
        method=clock.method,
        plan=plan,
        passes=passes,
        gpu_start=start_state,
        gpu_end=end_state,
        peak_mem_mb=peak,
        shield_ms=clock.shield_ms,
        l2_flush_mb=clock.l2_flush_mb,
        wall_s=time.perf_counter() - t0,
    )
