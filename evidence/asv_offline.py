"""The published asv site, opened with no network in headless Chromium (#15).

What it does: records two points of asv history for a tiny CPU timing case (`attn-gate bench
--quick`, two commits), publishes the site twice, once as `asv publish` writes it (the control:
its scripts come from CDNs) and once as `attn-gate publish` writes it (scripts shipped with it),
serves each on 127.0.0.1 and opens the speed-ratio graph in headless Chromium with every other
host unreachable. It prints whether the graph rendered (flot's canvas in the DOM) for each and
saves a screenshot of the offline-ready site.

Run (CPU, ~1 minute; needs `chromium`, e.g. `apt-get install chromium`):

    python evidence/asv_offline.py [--out reports/cpu]

Writes OUT/asv-offline.png (the offline site's graph) and OUT/asv-offline-control.png (asv's own
output without network). Exit 0 when the shipped site renders and the control does not.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASE = "fp32-b1-h2-s32-d16"
TINY = """
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
"""
GRAPH = f"#bench_attention.AttentionSpeed.track_fwd_speed_ratio?p-kernel='tiled'&p-anchor='sdpa-math'&p-case='{CASE}'"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@contextlib.contextmanager
def serve(folder: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # the browser closing a connection early is not news

    server = Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def browse(url: str, screenshot: Path | None = None, browser: str | None = None) -> str:
    """The DOM after the page's scripts ran, every host but 127.0.0.1 unreachable."""
    browser = browser or chromium()
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--proxy-server=http://127.0.0.1:9",
            "--proxy-bypass-list=127.0.0.1", "--virtual-time-budget=15000", "--window-size=1400,900"]
    with tempfile.TemporaryDirectory() as profile:
        args.append(f"--user-data-dir={profile}")
        dom = subprocess.run(args + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        if screenshot is not None:
            subprocess.run(args + [f"--screenshot={Path(screenshot).resolve()}", url], capture_output=True, text=True,
                           timeout=120)
    return dom


def scripts_ran(dom: str) -> bool:
    """asv's scripts loaded and read the results: its benchmark list is in the page (asv's failure
    page, shown when a script does not load, has none)."""
    return "track_fwd_speed_ratio</a>" in dom and "failed to load" not in dom.lower()


def rendered(dom: str) -> bool:
    """flot draws the graph into a canvas of class flot-base; asv's failure page says it failed to load."""
    return "flot-base" in dom and "failed to load" not in dom.lower()


def build_site(tmp: Path) -> Path:
    (tmp / "pyproject.toml").write_text(TINY)
    conf = json.loads((REPO / "asv.conf.json").read_text())
    conf.update(repo=str(REPO), benchmark_dir=str(REPO / "benchmarks"), results_dir=str(tmp / "results"),
                html_dir=str(tmp / "html"), env_dir=str(tmp / "env"))
    branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    conf["branches"] = [branch or "main"]  # asv plots only commits of its branches: this checkout's
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    env = {**os.environ, "HOME": str(tmp), "OMP_NUM_THREADS": "1"}
    for ref in ("HEAD~1", "HEAD"):
        cmd = [sys.executable, "-m", "gate", "bench", "--asv-config", str(tmp / "asv.conf.json"), "--quick", "--commit", ref,
               "--machine", "cpu", "--device", "cpu", "--config", str(tmp / "pyproject.toml")]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            sys.exit(f"attn-gate bench failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return tmp / "asv.conf.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "cpu")
    args = parser.parse_args()
    if chromium() is None:
        print("no chromium on PATH: apt-get install chromium", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from gate.speed import asv as A
    from gate.speed.asv_offline import make_offline, remote_resources

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        conf = build_site(tmp)
        html = tmp / "html"
        if A.run_asv(["publish"], conf) != 0:  # asv's own output: the control
            sys.exit("asv publish failed")
        with serve(html) as base:
            control = rendered(browse(base + "index.html" + GRAPH, args.out / "asv-offline-control.png"))
        print(f"asv publish as is, no network: graph rendered = {control}; CDN resources: "
              f"{len(remote_resources((html / 'index.html').read_text()))}")
        replaced = make_offline(html)
        with serve(html) as base:
            offline = rendered(browse(base + "index.html" + GRAPH, args.out / "asv-offline.png"))
        print(f"attn-gate publish (shipped scripts), no network: graph rendered = {offline}; CDN resources replaced: "
              f"{len(replaced)}, left: {len(remote_resources((html / 'index.html').read_text()))}")
        print(f"screenshots: {args.out / 'asv-offline.png'}, {args.out / 'asv-offline-control.png'}")
    return 0 if offline and not control else 1


if __name__ == "__main__":
    sys.exit(main())
