"""asv suites: thin track_* wrappers over attn-gate's timing engine (gate/speed/timing.py).

asv times `time_*` with a wall clock, which means nothing for asynchronous GPU work, so every
number here is a `track_*` returning what the engine measured (CUDA events, cold L2, candidate
and anchor interleaved). One engine run per perf case happens in `setup_cache` (once per asv
run); the track functions only read it.

What runs comes from the environment (`attn-gate bench` sets it) or the config's profile:
ATTN_GATE_CONFIG (pyproject.toml), ATTN_GATE_KERNEL, ATTN_GATE_SUITE, ATTN_GATE_ANCHOR,
ATTN_GATE_DEVICE, ATTN_GATE_ONLY (regex on case ids), ATTN_GATE_ROUNDS.
"""

from gate.speed.asv import bench_case_ids, bench_measure, bench_peak_mem

try:  # asv >= 0.6 (asv_runner): a track function may skip itself for one parameter set
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # pragma: no cover - older asv skips on NotImplementedError
    SkipNotImplemented = NotImplementedError


def _value(cache, case, pass_, key):
    """One measured number; a forward-only case (decode, issue #10) has no backward, a dense case
    no K/V bandwidth: skipped for that case, never recorded as 0 or failed."""
    row = cache[case].get(pass_) or {}
    if key not in row:
        raise SkipNotImplemented(f"{case}: no {pass_} {key} (forward-only or not a decode case)")
    return row[key]


class AttentionSpeed:
    params = [bench_case_ids()]
    param_names = ["case"]
    timeout = 3600

    def setup_cache(self):
        return bench_measure()

    setup_cache.timeout = 3600

    def setup(self, cache, case):
        if cache.get(case, {}).get("status") != "OK":
            raise NotImplementedError(cache.get(case, {}).get("reason", "not measured"))  # asv: skipped

    def track_fwd_ms(self, cache, case):
        return _value(cache, case, "fwd", "candidate_ms")

    track_fwd_ms.unit = "ms"

    def track_bwd_ms(self, cache, case):
        return _value(cache, case, "bwd", "candidate_ms")

    track_bwd_ms.unit = "ms"

    def track_fwd_speed_ratio(self, cache, case):
        return _value(cache, case, "fwd", "speed_ratio")

    track_fwd_speed_ratio.unit = "candidate/anchor"

    def track_bwd_speed_ratio(self, cache, case):
        return _value(cache, case, "bwd", "speed_ratio")

    track_bwd_speed_ratio.unit = "candidate/anchor"

    def track_tflops(self, cache, case):
        return _value(cache, case, "fwd", "candidate_tflops")

    track_tflops.unit = "TFLOP/s (fwd)"

    def track_bwd_tflops(self, cache, case):
        return _value(cache, case, "bwd", "candidate_tflops")

    track_bwd_tflops.unit = "TFLOP/s (bwd)"

    def track_kv_gbps(self, cache, case):
        """Decode cases (issue #10): achieved GB/s of K/V read by one decode step (H200: ~4800)."""
        return _value(cache, case, "fwd", "candidate_kv_gbps")

    track_kv_gbps.unit = "GB/s (K/V read, fwd)"


class AttentionMemory:
    """Peak GPU memory of one fwd+bwd, measured alone (skipped without a GPU: no allocator stats)."""

    params = [bench_case_ids()]
    param_names = ["case"]
    timeout = 1800

    def setup_cache(self):
        return bench_peak_mem()

    setup_cache.timeout = 1800

    def setup(self, cache, case):
        if cache.get(case) is None:
            raise NotImplementedError("peak memory is measured on a GPU only")  # asv: skipped

    def track_peak_mem_mb(self, cache, case):
        return cache[case]

    track_peak_mem_mb.unit = "MiB"

