"""asv glue: what the benchmark suite measures, the asv command lines, and reading asv's results.

asv gives history (`asv run` + `asv publish`), not the PR verdict: with environment_type
"existing" (`--python=same`) results are only saved with `--set-commit-hash`, `asv continuous`
refuses that mode, and `asv compare` exits 0 on regressions. The verdict is `attn-gate check`.

asv itself is imported lazily (only `bench`/`publish` need it): `attn-gate perf` runs on a GPU
box without asv installed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.core.config import load_config
from gate.core.errors import UserError
from gate.speed.asv_offline import make_offline
from gate.speed.runs import PerfTarget, perf_cases, run_perf_here
from gate.speed.timing import KernelWorkload, workload_peak_mem_mb

# The repository is where the command runs (an installed attn-gate has no checkout to point at).
CONFIG_FILE = Path("pyproject.toml")
ASV_CONF = Path("asv.conf.json")


@dataclass(frozen=True)
class BenchSettings:
    config_path: Path
    kernel: str | None
    suite: str | None
    anchor: str | None
    device: str | None
    only: str | None
    rounds: int | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "BenchSettings":
        env = os.environ if env is None else env
        rounds = env.get("ATTN_GATE_ROUNDS")
        return cls(
            config_path=Path(env.get("ATTN_GATE_CONFIG") or CONFIG_FILE.resolve()),
            kernel=env.get("ATTN_GATE_KERNEL") or None,
            suite=env.get("ATTN_GATE_SUITE") or None,
            anchor=env.get("ATTN_GATE_ANCHOR") or None,
            device=env.get("ATTN_GATE_DEVICE") or None,
            only=env.get("ATTN_GATE_ONLY") or None,
            rounds=int(rounds) if rounds else None,
        )

    def to_env(self) -> dict[str, str]:
        values = {
            "ATTN_GATE_CONFIG": str(self.config_path),
            "ATTN_GATE_KERNEL": self.kernel,
            "ATTN_GATE_SUITE": self.suite,
            "ATTN_GATE_ANCHOR": self.anchor,
            "ATTN_GATE_DEVICE": self.device,
            "ATTN_GATE_ONLY": self.only,
            "ATTN_GATE_ROUNDS": None if self.rounds is None else str(self.rounds),
        }
        return {k: v for k, v in values.items() if v}


def _config(settings: BenchSettings):
    return load_config(settings.config_path)


def _profile_suite(settings: BenchSettings, config) -> str:
    if settings.suite:
        return settings.suite
    device = settings.device or ("cuda" if _cuda() else "cpu")
    return config.profile(device).suite


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def bench_case_ids(settings: BenchSettings | None = None) -> list[str]:
    """The asv parameter list: ids of the suite's perf cases (asv discovery; no GPU work)."""

    settings = settings or BenchSettings.from_env()
    config = _config(settings)
    return [c.id for c in perf_cases(_profile_suite(settings, config), config, settings.only)]


def bench_identity(settings: BenchSettings | None = None) -> tuple[list[str], list[str]]:
    """The kernel and the anchor, as asv parameters: they are part of a benchmark's identity,
    so switching the kernel (or the anchor) starts a new line in the history instead of reading as
    a 7x regression of the old one."""
    settings = settings or BenchSettings.from_env()
    config = _config(settings)
    device = settings.device or ("cuda" if _cuda() else "cpu")
    return [settings.kernel or config.profile(device).kernel], [settings.anchor or config.perf.anchor_for(device)]


# a perf summary's numbers of the kernel alone (the rest - speed_ratio, its CI, noise, spread, the
# anchor's ms - depend on the anchor)
KERNEL_ONLY_KEYS = frozenset({"candidate_ms", "candidate_tflops", "candidate_kv_gbps", "rounds"})


def bench_measure(settings: BenchSettings | None = None) -> dict[str, dict[str, Any]]:
    """One engine run over the perf cases, flattened to plain numbers for asv's track_* methods."""

    settings = settings or BenchSettings.from_env()
    config = _config(settings)
    device = settings.device or ("cuda" if _cuda() else "cpu")
    kernel = settings.kernel or config.profile(device).kernel
    target = PerfTarget.of(
        kernel, config.suite(_profile_suite(settings, config)), config.perf, device, settings.anchor, settings.only
    )
    from gate.kernels.registry import kernel_entry

    result = run_perf_here(
        target,
        kernel_entry(kernel, config).adapter(),
        rounds=settings.rounds,
        progress=lambda line: print(f"attn-gate bench: {line}", file=sys.stderr, flush=True),
    )
    out = {}
    for c in result.cases:
        row: dict[str, Any] = {"status": c.label, "reason": c.reason}
        if c.measured:
            summary = c.summary()
            row.update({p: summary[p] for p in ("fwd", "bwd") if p in summary})
            if c.fell_back(result.anchor):
                # timed against the anchor_fallback: nothing measured against it belongs on this history
                # line (its `anchor` parameter is the run's anchor); the kernel's own numbers do
                for p in ("fwd", "bwd"):
                    if p in row:
                        row[p] = {k: v for k, v in row[p].items() if k in KERNEL_ONLY_KEYS}
        out[c.case_id] = row
    return out


def bench_peak_mem(settings: BenchSettings | None = None) -> dict[str, float | None]:
    """Peak GPU memory of one fwd+bwd per perf case (None where not measurable: CPU, skipped case)."""
    from gate.kernels.registry import kernel_entry

    settings = settings or BenchSettings.from_env()
    config = _config(settings)
    device = settings.device or ("cuda" if _cuda() else "cpu")
    name = settings.kernel or config.profile(device).kernel
    adapter = kernel_entry(name, config).adapter()
    out: dict[str, float | None] = {}
    for case in perf_cases(_profile_suite(settings, config), config, settings.only):
        if device != "cuda" or adapter.unsupported_reason(case, device):
            out[case.id] = None
            continue
        try:
            out[case.id] = workload_peak_mem_mb(KernelWorkload(adapter, case, device), device)
        except Exception as exc:
            print(f"attn-gate bench: peak memory of {case.id} not measured: {exc}", file=sys.stderr)
            out[case.id] = None
    return out


# --------------------------------------------------------------------------------------------
# Running asv


def asv_executable() -> list[str]:
    """`python -m asv` of this interpreter; a clear error where asv is not installed."""
    try:
        import asv  # noqa: F401
    except ImportError:
        raise UserError(
            "asv is not installed here: `pip install asv` (only `attn-gate bench` and "
            "`attn-gate publish` need it; `attn-gate perf` does not)"
        ) from None
    return [sys.executable, "-m", "asv"]


def asv_conf(path: Path | None) -> Path:
    path = Path(path) if path else ASV_CONF.resolve()
    if not path.is_file():
        raise UserError(f"--asv-config {path}: no such file (default: ./asv.conf.json; `attn-gate init` writes one)")
    return path


def asv_repo(conf: Path) -> Path:
    """The repository asv.conf.json points at (its "repo", relative to the file)."""

    repo = json.loads(Path(conf).read_text(encoding="utf-8")).get("repo", ".")
    return (Path(conf).parent / repo).resolve()


def git_commit(ref: str, cwd: Path) -> str:
    git = shutil.which("git")
    if git is None:
        raise UserError("git is not on PATH: `attn-gate bench` needs it to name the commit (--commit HASH)")
    proc = subprocess.run([git, "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"--commit {ref!r} is not a commit of {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def machine_name(device: str | None = None) -> str:
    """asv machine name = the GPU class (h200, h100, ...) or 'cpu': history never mixes classes."""
    from gate.core.environment import gpu_class

    device = device or ("cuda" if _cuda() else "cpu")
    if device != "cuda":
        return "cpu"
    import torch

    return gpu_class(torch.cuda.get_device_properties(0).name)


def run_asv(args: list[str], conf: Path, env: dict[str, str] | None = None) -> int:
    cmd = asv_executable() + [args[0], "--config", str(conf)] + args[1:]
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, cwd=conf.parent, env={**os.environ, **(env or {})}).returncode


def bench(
    conf: Path, settings: BenchSettings, machine: str, commit: str, quick: bool = False, bench_regex: str | None = None
) -> int:
    """`asv machine` (name = GPU class) then `asv run --python=same --set-commit-hash`; asv's exit code."""
    rc = run_asv(["machine", "--yes", "--machine", machine], conf)
    if rc != 0:
        return rc
    args = [
        "run",
        "--python=same",
        "--set-commit-hash",
        commit,
        "--machine",
        machine,
        "--launch-method",
        "spawn",
        "--show-stderr",
    ]
    if quick:
        args.append("--quick")
    if bench_regex:
        args += ["--bench", bench_regex]
    return run_asv(args, conf, settings.to_env())


def publish(conf: Path) -> int:
    """`asv publish`, then the site made readable offline (its scripts shipped with it)."""
    rc = run_asv(["publish"], conf)
    if rc == 0:
        html_dir = Path(conf).parent / load_asv_conf(conf).html_dir
        replaced = make_offline(html_dir)
        print(
            f"made {html_dir} readable offline: {len(replaced)} CDN scripts/styles replaced by local copies",
            file=sys.stderr,
        )
    return rc


def load_asv_conf(conf: Path):
    asv_executable()
    from asv.config import Config

    return Config.load(str(conf))


def read_results(conf: Path, machine: str, commit: str) -> list[dict[str, Any]]:
    """Rows (benchmark, params, value, unit) for one machine and commit, through asv's own API."""
    asv_executable()
    from asv import results as asv_results
    from asv.benchmarks import Benchmarks

    aconf = load_asv_conf(conf)
    try:
        benchmarks = Benchmarks.load(aconf)
    except Exception:
        benchmarks = {}
    rows = []
    for res in asv_results.iter_results_for_machine_and_hash(aconf.results_dir, machine, commit):
        for key in sorted(res.get_all_result_keys()):
            params = res.get_result_params(key)
            values = res.get_result_value(key, params)
            unit = benchmarks[key].get("unit", "") if key in benchmarks else ""
            combos = _param_combos(params)
            for combo, value in zip(combos, values if isinstance(values, list) else [values]):
                rows.append({"benchmark": key, "params": combo, "value": value, "unit": unit})
    return rows


def _param_combos(params) -> list[tuple[str, ...]]:
    if not params:
        return [()]
    return [tuple(re.sub(r"^'(.*)'$", r"\1", str(p)) for p in combo) for combo in itertools.product(*params)]
