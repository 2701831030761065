"""The asv suite, discovered and run by real asv (environment "existing", quick mode) on a tiny
CPU case, read back through asv's own results API, then `asv publish` rendering HTML.
Asserts that numbers were recorded, never what they are."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import require

# its tests share one module-scoped run: one worker makes it (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("asv")


REPO = Path(__file__).resolve().parents[1]

TINY_CONFIG = """
[tool.attn-gate.cpu]
kernel = "tiled"
suite = "tiny"

[tool.attn-gate.perf]
cpu_anchor = "sdpa-math"
rounds = 3
calls_per_round = 1
warmup_s = 0.0

[tool.attn-gate.suites.tiny]
description = "one tiny timing case"
seeds = [0]

[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["fp32"]
batch = [1]
seqlens = ["32"]
heads = ["2"]
head_dims = ["16"]
perf = [true]

[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["fp32"]
entry = ["kvcache"]
batch = [2]
seqlens = ["1x64"]
heads = ["2/1"]
head_dims = ["16"]
perf = [true]
"""

CASE_ID = "fp32-b1-h2-s32-d16"
DECODE_ID = "fp32-b2-h2/1-s1x64-d16-kv"  # forward-only (its bwd tracks skip themselves)


@pytest.fixture(scope="module")
def asv_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("asv")
    (tmp / "pyproject.toml").write_text(TINY_CONFIG)
    conf = json.loads((REPO / "asv.conf.json").read_text())
    conf.update(
        repo=str(REPO),
        benchmark_dir=str(REPO / "benchmarks"),
        results_dir=str(tmp / "results"),
        html_dir=str(tmp / "html"),
        env_dir=str(tmp / "env"),
    )
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    from gate.speed.asv import git_commit

    commit = git_commit("HEAD", REPO)  # fixed up front: others may commit while the test runs
    env = {**os.environ, "HOME": str(tmp)}  # asv keeps its machine file in ~/.asv-machine.json
    cmd = [
        sys.executable,
        "-m",
        "gate",
        "bench",
        "--asv-config",
        str(tmp / "asv.conf.json"),
        "--quick",
        "--commit",
        commit,
        "--machine",
        "cpu-test",
        "--device",
        "cpu",
        "--config",
        str(tmp / "pyproject.toml"),
    ]
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=240)
    return tmp, env, proc, commit


@pytest.mark.slow
def test_asv_discovers_and_runs_the_track_benchmarks(asv_run):
    tmp, _, proc, commit = asv_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from gate.speed.asv import read_results

    rows = read_results(tmp / "asv.conf.json", "cpu-test", commit)
    got = {r["benchmark"].split(".")[-1]: r for r in rows if r["params"][-1] == CASE_ID}
    for name in ("track_fwd_ms", "track_bwd_ms", "track_fwd_speed_ratio", "track_bwd_speed_ratio"):
        assert name in got, sorted(got)
        assert isinstance(got[name]["value"], float) and got[name]["value"] > 0, got[name]
    # kernel and anchor are part of the identity; only lower-is-better numbers are tracked
    assert got["track_fwd_speed_ratio"]["params"] == ("tiled", "sdpa-math", CASE_ID)
    assert got["track_peak_mem_mb"]["params"] == ("tiled", CASE_ID)
    assert not any("tflops" in name for name in got)
    assert got["track_fwd_speed_ratio"]["unit"] == "kernel time / anchor time"
    peak = got["track_peak_mem_mb"]["value"]
    assert peak is None or math.isnan(peak)  # no allocator statistics on the CPU: skipped, not 0
    assert "failed" not in proc.stdout
    assert "track_fwd_speed_ratio" in proc.stdout
    decode = {r["benchmark"].split(".")[-1]: r for r in rows if r["params"][-1] == DECODE_ID}
    assert decode["track_fwd_ms"]["value"] > 0 and decode["track_fwd_speed_ratio"]["value"] > 0, decode
    for name in ("track_bwd_ms", "track_bwd_speed_ratio"):  # forward-only: skipped, not 0
        assert decode[name]["value"] is None or math.isnan(decode[name]["value"]), decode[name]
    assert not any("gbps" in name for name in got)  # K/V GB/s is higher-is-better: in perf's JSON, not asv


@pytest.mark.slow
def test_asv_publish_writes_html(asv_run):
    tmp, env, proc, _ = asv_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    pub = subprocess.run(
        [sys.executable, "-m", "gate", "publish", "--asv-config", str(tmp / "asv.conf.json")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pub.returncode == 0, pub.stdout[-3000:] + pub.stderr[-3000:]
    assert (tmp / "html" / "index.html").is_file()
    from gate.speed.asv_offline import remote_resources

    for page in (tmp / "html").glob("*.html"):  # nothing loaded from a CDN; the copies are there
        assert remote_resources(page.read_text()) == [], page
    assert (tmp / "html" / "vendor" / "js" / "jquery.min.js").is_file()


def test_bench_without_asv_config_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gate", "bench", "--asv-config", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "nope.json: no such file" in proc.stderr


@pytest.mark.slow
def test_the_published_site_runs_its_scripts_in_a_browser_without_network(asv_run, monkeypatch):
    """headless Chromium, every host but 127.0.0.1 unreachable. asv's own output (scripts from
    CDNs) shows asv's "failed to load" page; after make_offline (what `attn-gate publish` does) the
    page runs its scripts and lists the benchmarks."""
    from gate.speed import asv as A
    from gate.speed.asv_offline import make_offline
    from tests.asv_browser import GRAPH, browse, scripts_ran, serve

    browser = require("chromium", "apt-get install chromium, or your system's Chromium package")
    tmp, env, proc, _ = asv_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("HOME", env["HOME"])
    assert A.run_asv(["publish"], tmp / "asv.conf.json") == 0  # asv as it is: the control
    with serve(tmp / "html") as base:
        assert not scripts_ran(browse(base + "index.html" + GRAPH, browser=browser))
    make_offline(tmp / "html")
    with serve(tmp / "html") as base:
        dom = browse(base + "index.html" + GRAPH, browser=browser)
    assert scripts_ran(dom), dom[-2000:]
