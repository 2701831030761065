"""Every link `init`, the files it writes and its messages print resolves: a page named by
`attn-gate docs NAME` or docs/NAME.md is shipped in the package; a URL is the user's own
repository or a package index the jobs install from, never an invented attn-gate address."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from gate.commands import init as init_command
from gate.commands.main import main
from gate.core import docs
from gate.core.config import load_config
from gate.workflow import init as I
from gate.workflow import install_source as S

ROOT = Path(__file__).resolve().parents[1]
# a host name first: a regular expression that validates URLs (the guard's INDEX_URL) is no link
URL = re.compile(r"https?://[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+[^\s\"'`)<>\]]*")
DOC_PATH = re.compile(r"\bdocs/([\w/-]+)\.md")
DOC_COMMAND = re.compile(r"attn-gate docs ([\w/-]+)")
INDEXES = ("https://download.pytorch.org/whl/", "https://pypi.org/simple")


def links(text: str) -> tuple[set[str], set[str]]:
    return set(URL.findall(text)), set(DOC_PATH.findall(text)) | set(DOC_COMMAND.findall(text))


def test_the_docs_named_are_shipped_and_printable(capsys):
    assert {"ci", "adopt", "configuration", "kernels"} <= set(docs.pages())
    assert main(["docs", "ci", "--path"]) == 0
    assert Path(capsys.readouterr().out.strip()) == docs.page("ci") and docs.page("ci").is_file()
    assert main(["docs", "adopt"]) == 0 and "attn-gate init" in capsys.readouterr().out
    assert main(["docs", "nosuch"]) == 2 and "`attn-gate docs` lists them" in capsys.readouterr().err


def test_every_link_init_writes_or_prints_resolves(tmp_path, capsys, monkeypatch):
    repo = tmp_path / "tiny-attn"
    shutil.copytree(ROOT / "examples" / "tiny-attn", repo, ignore=shutil.ignore_patterns("__pycache__"))
    assert (
        main(
            [
                "init",
                "--dir",
                str(repo),
                "--yes",
                "--repository",
                "me/tiny",
                "--kernel",
                "tiny_attn:flash_attn_func",
                "--install",
                "attn-gate==0.1.0",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    local = S.from_direct_url('{"url": "file:///tmp/attn_gate-0.1.0-py3-none-any.whl", "archive_info": {}}', "0.1.0")
    monkeypatch.setattr(init_command, "installed_source", lambda version: local)
    assert main(["init", "--dir", str(tmp_path), "--yes", "--kernel", "x:y", "--repository", "me/tiny"]) == 2
    refusal = capsys.readouterr().err
    assert "attn-gate docs adopt" in refusal  # a refusal names a page too
    printed += refusal
    ci = load_config(repo / "pyproject.toml").ci
    texts = {rel: (repo / rel).read_text() for rel in I.render_files(ci)} | {
        "stdout": printed,
        "pyproject.toml": (repo / "pyproject.toml").read_text(),
    }
    urls, pages = set(), set()
    for rel, text in texts.items():
        u, p = links(text)
        urls |= u
        pages |= p
    assert "ci" in pages  # the workflows' messages and the checklist do name a page
    assert not pages - set(docs.pages()), f"pages not shipped: {sorted(pages - set(docs.pages()))}"
    for url in urls:
        assert url.startswith(INDEXES) or url.rstrip("/") == "https://github.com/me/tiny", url
    assert not any("github.com/attn-gate" in t for t in texts.values())


def test_this_repositorys_docs_value_is_a_file_here():
    assert (ROOT / load_config(ROOT / "pyproject.toml").ci.docs).is_file()
