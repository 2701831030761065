"""Where this attn-gate came from, and the pip requirement a CI job can install the same one with.

The source is the installed distribution's PEP 610 record (`direct_url.json`): a VCS URL and
commit, an archive (a wheel) at a URL or a local path, a local folder, or nothing (an install from
the package index, by version). A runner reaches neither this machine's paths nor its wheels, so a
local source gives no requirement: `init` then needs `--install`.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

DIST = "attn-gate"
# The attn-gate requirement inside an install line: `attn-gate==X`, `attn-gate @ URL`.
IN_LINE = re.compile(r"""attn[-_]gate\s*(?:(?P<pin>==\s*[^\s"';&|]+)|@\s*(?P<url>[^\s"';&|]+))""")


@dataclass(frozen=True)
class InstallSource:
    kind: str  # "vcs", "archive", "local", "index"
    requirement: str | None  # what a runner can install; None for a local source
    where: str  # for a message: the URL, path or version it came from


def from_direct_url(record: str | None, version: str) -> InstallSource:
    """The source a PEP 610 record (its JSON text, None when absent) describes."""
    if record is None:
        return InstallSource("index", f"{DIST}=={version}", f"the package index (version {version})")
    try:
        data = json.loads(record)
        url = data["url"]
        if not isinstance(url, str) or not isinstance(data, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return InstallSource("local", None, "an unreadable direct_url.json")
    remote = url.startswith(("https://", "http://", "ssh://", "git://")) or re.match(r"^[\w.-]+@[\w.-]+:", url)
    vcs = data.get("vcs_info")
    if isinstance(vcs, dict):
        commit = vcs.get("commit_id")
        where = f"{vcs.get('vcs', 'git')}+{url}@{commit}"
        if remote and isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,64}", commit):
            return InstallSource("vcs", f"{DIST} @ {where}", where)
        return InstallSource("local", None, where)
    if isinstance(data.get("archive_info"), dict) and remote:
        hashes = data["archive_info"].get("hashes") or {}
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        fragment = f"#sha256={sha}" if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) else ""
        return InstallSource("archive", f"{DIST} @ {url}{fragment}", url)
    return InstallSource("local", None, url)


def checkout_requirement(where: str) -> str | None:
    """For a source that is a local git checkout with a remote `origin`: the requirement of its
    HEAD commit at that remote (what a runner can install once the commit is pushed), else None."""
    path = Path(unquote(urlparse(where).path)) if where.startswith("file://") else None
    if path is None or not path.is_dir():
        return None
    try:
        remote, head = (
            subprocess.run(["git", "-C", str(path), *cmd], capture_output=True, text=True, timeout=10).stdout.strip()
            for cmd in (("remote", "get-url", "origin"), ("rev-parse", "HEAD"))
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if not re.fullmatch(r"[0-9a-f]{40,64}", head) or not re.match(r"^(https://|ssh://|git@)[\w.@:/~-]+$", remote):
        return None
    return f"{DIST} @ git+{remote}@{head}"


def installed_source(version: str) -> InstallSource:
    """How the attn-gate that runs now was installed. The first record on sys.path is the one in
    use; a record no installer wrote (a checkout's own egg-info) is a source checkout: local."""
    dist = next(iter(metadata.distributions(name=DIST)), None)
    if dist is None or dist.read_text("INSTALLER") is None:
        return InstallSource("local", None, "a source checkout")
    return from_direct_url(dist.read_text("direct_url.json"), version)


def requirement_in(line: str) -> str | None:
    """The attn-gate requirement an install line names, normalised (`attn-gate==X`, `attn-gate @ URL`)."""
    m = IN_LINE.search(line)
    if not m:
        return None
    return f"{DIST}=={m['pin'][2:].strip()}" if m["pin"] else f"{DIST} @ {m['url']}"


def mismatch(line: str, source: InstallSource, version: str) -> str | None:
    """Why the attn-gate an install line names cannot be the one installed here; None when it can
    (or the line names none: a script installs it)."""
    named = requirement_in(line)
    if named is None:
        return None
    if source.requirement is not None:
        if named == source.requirement:
            return None
        return f"installs {named!r}, but this attn-gate came from {source.where} ({source.requirement!r})"
    if named.startswith(f"{DIST}==") and named != f"{DIST}=={version}":  # local: only the version is known
        return f"installs {named!r}, but this attn-gate is version {version} (from {source.where})"
    return None
