"""Headless Chromium with no network, for the published asv site's test: serve a folder on
127.0.0.1, dump the DOM after the page's scripts ran, and tell asv's benchmark list from its
"failed to load" page."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

CASE = "fp32-b1-h2-s32-d16"
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
    args = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",
        "--proxy-bypass-list=127.0.0.1",
        "--virtual-time-budget=15000",
        "--window-size=1400,900",
    ]
    with tempfile.TemporaryDirectory() as profile:
        args.append(f"--user-data-dir={profile}")
        dom = subprocess.run(args + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        if screenshot is not None:
            subprocess.run(
                args + [f"--screenshot={Path(screenshot).resolve()}", url], capture_output=True, text=True, timeout=120
            )
    return dom


def scripts_ran(dom: str) -> bool:
    """asv's scripts loaded and read the results: its benchmark list is in the page (asv's failure
    page, shown when a script does not load, has none)."""
    return "track_fwd_speed_ratio</a>" in dom and "failed to load" not in dom.lower()
