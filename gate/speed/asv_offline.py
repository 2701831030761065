"""Make a published asv site work without network access.

asv 0.6's index.html loads jQuery, flot, bootstrap, stupidtable and md5 from CDNs, so a reader
without internet access (common on GPU clusters) sees asv's "failed to load" page. attn-gate
ships the same libraries (gate/vendor/asv_www/, taken unmodified from their npm packages; versions
and licenses in its README.md) and, after `asv publish`, copies them into the site and points the
HTML at those copies. A CDN address we have no copy for is an error, not a silent half-offline site
(a newer asv may add one: add the file to gate/vendor/asv_www/ and to LOCAL).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from gate.core.errors import UserError

WWW = Path(__file__).resolve().parents[1] / "vendor" / "asv_www"
VENDOR = "vendor"  # the folder inside the published site

# CDN file name (the last path part of the URL) -> our copy, relative to asv_www/
LOCAL = {
    "jquery-3.3.1.min.js": "js/jquery.min.js",
    "jquery.flot.min.js": "js/jquery.flot.js",
    "jquery.flot.time.min.js": "js/jquery.flot.time.js",
    "jquery.flot.selection.min.js": "js/jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "js/jquery.flot.categories.js",
    "jquery.flot.orderBars.js": "js/jquery.flot.orderBars.js",
    "stupidtable.min.js": "js/stupidtable.min.js",
    "md5.min.js": "js/md5.min.js",
    "bootstrap.min.js": "js/bootstrap.min.js",
    "bootstrap.min.css": "css/bootstrap.min.css",
}

_TAG = re.compile(r'<(script|link)\b([^>]*?)\b(src|href)="(https?://[^"]+)"([^>]*)>', re.IGNORECASE)
_DROP = re.compile(r'\s+(integrity|crossorigin|referrerpolicy)="[^"]*"', re.IGNORECASE)


def _localise(match: re.Match, missing: list[str]) -> str:
    tag, before, attr, url, after = match.groups()
    if tag.lower() == "link" and "stylesheet" not in (before + after).lower():
        return match.group(0)  # an ordinary hyperlink (<link rel="alternate" ...>), not a resource
    name = url.rsplit("/", 1)[-1]
    local = LOCAL.get(name)
    if local is None:
        missing.append(url)
        return match.group(0)
    return f'<{tag}{_DROP.sub("", before)}{attr}="{VENDOR}/{local}"{_DROP.sub("", after)}>'


def make_offline(html_dir: Path) -> list[str]:
    """Copy the shipped libraries into `html_dir`/vendor and point every *.html at them.
    Returns the CDN addresses replaced; raises a UserError naming any it has no copy of."""
    html_dir = Path(html_dir)
    pages = sorted(html_dir.glob("*.html"))
    if not pages:
        raise UserError(
            f"{html_dir}: no published asv pages to make offline (run `attn-gate publish` after `attn-gate bench`)"
        )
    target = html_dir / VENDOR
    for sub in ("js", "css", "fonts", "licenses"):
        shutil.copytree(WWW / sub, target / sub, dirs_exist_ok=True)
    shutil.copy2(WWW / "README.md", target / "README.md")
    replaced: list[str] = []
    missing: list[str] = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        found = [m.group(4) for m in _TAG.finditer(text)]
        new = _TAG.sub(lambda m: _localise(m, missing), text)
        replaced += [u for u in found if u not in missing]
        if new != text:
            page.write_text(new, encoding="utf-8")
    if missing:
        raise UserError(
            f"{html_dir}: asv loads {', '.join(sorted(set(missing)))} from the network and attn-gate ships no "
            f"copy of it; add the file to gate/vendor/asv_www/ and to LOCAL in gate/speed/asv_offline.py"
        )
    return replaced


def remote_resources(html: str) -> list[str]:
    """Scripts and stylesheets an HTML page still loads from the network (empty when offline-ready)."""
    out = []
    for m in _TAG.finditer(html):
        tag, before, _, url, after = m.groups()
        if tag.lower() == "script" or "stylesheet" in (before + after).lower():
            out.append(url)
    return out
