"""asv suites: thin track_* wrappers over attn-gate's timing engine (gate/speed/timing.py).

asv times `time_*` with a wall clock, which means nothing for asynchronous GPU work, so every
number here is a `track_*` returning what the engine measured (CUDA events, cold L2, candidate
and anchor interleaved). One engine run per perf case happens in `setup_cache` (once per asv
run); the track functions only read it.

Identity: every benchmark is parameterised by kernel, anchor and case, so a history line is
one kernel against one anchor; changing either starts a new line instead of a false regression.
Direction: asv flags an INCREASE as a regression, so only lower-is-better numbers are tracked
(milliseconds, speed ratio = kernel time / anchor time, MiB). Throughput (TFLOP/s, and a decode
case's K/V GB/s, higher is better) would read the wrong way round and is left out; it
is in `attn-gate perf`'s JSON.

Forward-only cases (decode) have no backward: their bwd tracks skip themselves for
that case (never recorded as 0 or failed).

What runs comes from the environment (`attn-gate bench` sets it) or the config's profile:
ATTN_GATE_CONFIG (pyproject.toml), ATTN_GATE_KERNEL, ATTN_GATE_SUITE, ATTN_GATE_ANCHOR,
ATTN_GATE_DEVICE, ATTN_GATE_ONLY (regex on case ids), ATTN_GATE_ROUNDS.
"""

from gate.speed.asv import bench_case_ids, bench_identity, bench_measure, bench_peak_mem

try:  # asv >= 0.6 (asv_runner): a track function may skip itself for one parameter set
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # pragma: no cover - older asv skips on NotImplementedError
    SkipNotImplemented = NotImplementedError

KERNELS, ANCHORS = bench_identity()


def _value(cache, case, pass_, key):
    """One measured number; a forward-only case (decode) has no backward, and a case
    timed against the anchor fallback has no speed ratio on this anchor's line: skipped for that
    case, never recorded as 0 or failed."""
    row = cache[case].get(pass_) or {}
    if key not in row:
        raise SkipNotImplemented(
            f"{case}: no {pass_} {key} (a forward-only case, or one timed against the anchor fallback)"
        )
    return row[key]


class AttentionSpeed:
    params = [KERNELS, ANCHORS, bench_case_ids()]
    param_names = ["kernel", "anchor", "case"]
    timeout = 3600

    def setup_cache(self):
        return bench_measure()

    setup_cache.timeout = 3600

    def setup(self, cache, kernel, anchor, case):
        if cache.get(case, {}).get("status") != "OK":
            raise NotImplementedError(cache.get(case, {}).get("reason", "not measured"))  # asv: skipped

    def track_fwd_ms(self, cache, kernel, anchor, case):
        return _value(cache, case, "fwd", "candidate_ms")

    track_fwd_ms.unit = "ms"

    def track_bwd_ms(self, cache, kernel, anchor, case):
        return _value(cache, case, "bwd", "candidate_ms")

    track_bwd_ms.unit = "ms"

    def track_fwd_speed_ratio(self, cache, kernel, anchor, case):
        return _value(cache, case, "fwd", "speed_ratio")

    track_fwd_speed_ratio.unit = "kernel time / anchor time"

    def track_bwd_speed_ratio(self, cache, kernel, anchor, case):
        return _value(cache, case, "bwd", "speed_ratio")

    track_bwd_speed_ratio.unit = "kernel time / anchor time"


class AttentionMemory:
    """Peak GPU memory of one fwd+bwd, measured alone (skipped without a GPU: no allocator stats)."""

    params = [KERNELS, bench_case_ids()]
    param_names = ["kernel", "case"]
    timeout = 1800

    def setup_cache(self):
        return bench_peak_mem()

    setup_cache.timeout = 1800

    def setup(self, cache, kernel, case):
        if cache.get(case) is None:
            raise NotImplementedError("peak memory is measured on a GPU only")  # asv: skipped

    def track_peak_mem_mb(self, cache, kernel, case):
        return cache[case]

    track_peak_mem_mb.unit = "MiB"
