"""A declared envelope, [tool.attn-gate.kernels.NAME.supports]: one vocabulary with the built-in
adapters' Capabilities, validated like every config key, and a case outside it a SKIP row that
names the declaring key and costs no worker call."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.core.cases import Case
from gate.core.config import load_config
from gate.core.envelope import SUPPORTS_KEYS, Feature, check_supports, render_supports
from gate.core.errors import UserError
from gate.core.results import Status
from gate.kernels.capabilities import Capabilities
from gate.kernels.registry import kernel_entry

ROOT = Path(__file__).resolve().parent.parent
BASE = dict(batch=1, seqlen_q=64, seqlen_k=64, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64, dtype="bf16")


def case(**changes) -> Case:
    return Case.build(**{**BASE, **changes})


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    return path


FAMILY = '[tool.attn-gate.kernels.mine]\ndense = "tests.envelope_kernels:attend"\n'


# ---------------------------------------------------------------- one vocabulary


def test_every_feature_is_a_supports_key_and_every_key_a_capabilities_limit():
    assert {f.value for f in Feature} <= set(SUPPORTS_KEYS)
    limits = {k for k, key in SUPPORTS_KEYS.items() if key.kind != "bool"}
    fields = set(Capabilities.__dataclass_fields__)
    assert limits <= fields, limits - fields
    # and what `attn-gate kernels` prints of any Capabilities is written in the same keys
    assert set(Capabilities().envelope()) <= set(SUPPORTS_KEYS)


def test_the_docs_list_every_supports_key():
    text = (ROOT / "docs" / "kernels.md").read_text()
    missing = [k for k in SUPPORTS_KEYS if not re.search(rf"^\| `{k}` \|", text, re.M)]
    assert not missing, f"docs/kernels.md lacks a row for {missing}"


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "table, words",
    [
        ("supports = {head_dim = [64]}", "unknown key 'head_dim'; did you mean 'head_dims'?"),
        ("supports = {gqa = 1}", "gqa = 1 is not valid; write gqa = true or false"),
        ('supports = {dtypes = "fp16"}', "dtypes = 'fp16' is not valid; write dtypes = a list drawn from fp16, bf16"),
        ('supports = {dtypes = ["fp64"]}', "dtypes names 'fp64'; choose from fp16, bf16, fp32, e4m3, e5m2"),
        ("supports = {head_dims = [0, 64]}", "head_dims = [0, 64] is not valid; write head_dims = a list of integers"),
        ("supports = {head_dims = {max = 128, step = 8}}", "head_dims has unknown key 'step'"),
        ("supports = {head_dims = {min = 256, max = 128}}", "head_dims has min 256 > max 128; swap them"),
        (
            "supports = {seqlen_multiple = 0}",
            "seqlen_multiple = 0 is not valid; write seqlen_multiple = an integer >= 1",
        ),
        ('supports = {layouts = ["rowmajor"]}', "layouts names 'rowmajor'; choose from contiguous"),
        ("supports = 3", "expected a table of keys devices, dtypes"),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_key_and_the_fix(tmp_path, table, words):
    path = write(tmp_path, FAMILY + table + "\n")
    with pytest.raises(UserError) as info:
        load_config(path)
    message = str(info.value)
    assert words in message and "\n" not in message
    assert f"{path} [tool.attn-gate].kernels.mine" in message


def test_a_bad_declaration_exits_2_from_the_cli(tmp_path, capsys):
    path = write(tmp_path, FAMILY + 'supports = {gqa = "no"}\n')
    with contextlib.chdir(tmp_path):
        assert main(["kernels", "--config", str(path)]) == 2
    assert "gqa = 'no' is not valid; write gqa = true or false" in capsys.readouterr().err


def test_a_function_table_holds_only_its_declaration(tmp_path):
    path = write(tmp_path, '[tool.attn-gate.kernels."tests.envelope_kernels:attend"]\ndense = "a.b:c"\n')
    with pytest.raises(UserError, match="holds only its supports table, not 'dense'"):
        load_config(path)
    path = write(tmp_path, '[tool.attn-gate.kernels."not a function"]\nsupports = {gqa = false}\n')
    with pytest.raises(UserError, match="rename the table"):
        load_config(path)


def test_render_supports_reads_back_as_the_same_declaration():
    import tomllib

    supports = {"dtypes": ["fp16"], "head_dims": {"min": 32, "max": 128}, "gqa": False, "seqlen_multiple": 128}
    text = render_supports(supports, 'tool.attn-gate.kernels."m:f".supports')
    parsed = tomllib.loads(text)["tool"]["attn-gate"]["kernels"]["m:f"]["supports"]
    assert check_supports(parsed, "x") == supports


# ---------------------------------------------------------------- cases outside it SKIP, with the key


def reason(tmp_path, supports: str, c: Case, body: str = FAMILY) -> str | None:
    config = load_config(write(tmp_path, body + f"supports = {{{supports}}}\n"))
    return kernel_entry("mine", config).adapter().unsupported_reason(c, "cpu")


TABLE = "[tool.attn-gate.kernels.mine.supports]"


@pytest.mark.parametrize(
    "supports, inside, outside, words",
    [
        (
            "head_dims = {max = 128}",
            dict(head_dim=128, head_dim_v=128),
            dict(head_dim=256, head_dim_v=256),
            f"declared: head_dim 256 (supports <= 128) ({TABLE} head_dims)",
        ),
        (
            "head_dims = [64, 128]",
            dict(head_dim=128, head_dim_v=128),
            dict(head_dim=96, head_dim_v=96),
            f"declared: head_dim 96 (supports 64, 128) ({TABLE} head_dims)",
        ),
        (
            "head_dims_v = {max = 64}",
            dict(head_dim=128, head_dim_v=64),
            dict(head_dim=64, head_dim_v=128),
            f"declared: head_dim_v 128 (supports <= 64) ({TABLE} head_dims_v)",
        ),
        (
            'dtypes = ["fp16"]',
            dict(dtype="fp16"),
            dict(dtype="bf16"),
            f"declared: no bf16 (supports fp16) ({TABLE} dtypes)",
        ),
        (
            "seqlen_multiple = 128",
            dict(seqlen_q=128, seqlen_k=256),
            dict(seqlen_q=128, seqlen_k=200),
            f"declared: seqlen 200 not a multiple of 128 ({TABLE} seqlen_multiple)",
        ),
        (
            "max_seqlen = 512",
            dict(seqlen_q=512, seqlen_k=512),
            dict(seqlen_q=64, seqlen_k=1024),
            f"declared: seqlen 1024 > 512 ({TABLE} max_seqlen)",
        ),
        (
            "max_batch_heads = 65535",
            dict(batch=16383, heads_q=4, heads_kv=4),
            dict(batch=16385, heads_q=4, heads_kv=4),
            f"declared: batch x heads 65,540 > 65,535 ({TABLE} max_batch_heads)",
        ),
        (
            "seqlen_q_ne_k = false",
            dict(seqlen_q=64, seqlen_k=64),
            dict(seqlen_q=64, seqlen_k=128),
            f"declared: seqlen_q != seqlen_k ({TABLE} seqlen_q_ne_k = false)",
        ),
        ("gqa = false", dict(heads_kv=4), dict(heads_kv=1), f"declared: no GQA/MQA ({TABLE} gqa = false)"),
        ("causal = false", dict(causal=False), dict(causal=True), f"declared: no causal mask ({TABLE} causal = false)"),
        (
            "non_causal = false",
            dict(causal=True),
            dict(causal=False),
            f"declared: no attention without a causal mask ({TABLE} non_causal = false)",
        ),
        (
            'layouts = ["contiguous"]',
            dict(layout="contiguous"),
            dict(layout="bhsd_view"),
            f"declared: layout bhsd_view (supports contiguous) ({TABLE} layouts)",
        ),
        ('devices = ["cuda"]', None, dict(), f"declared: runs on cuda, not cpu ({TABLE} devices)"),
    ],
)
def test_a_case_outside_the_declared_envelope_skips_with_the_declaring_key(tmp_path, supports, inside, outside, words):
    if inside is not None:
        assert reason(tmp_path, supports, case(**inside)) is None
    assert reason(tmp_path, supports, case(**outside)) == words


def test_a_declared_bias_kind_limit_skips_other_kinds():
    decl = Capabilities.from_declaration(check_supports({"bias_kinds": ["none", "dense"]}, "t"), "T")
    assert decl.unsupported_reason(case(bias="dense"), "cpu") is None
    assert (
        decl.unsupported_reason(case(bias="bool_mask"), "cpu")
        == "declared: bias bool_mask (supports none, dense) (T bias_kinds)"
    )


def test_the_signature_wins_over_a_declared_true(tmp_path):
    """upto_128 takes no window_size: declaring window = true cannot make the gate pass one."""
    body = '[tool.attn-gate.kernels.mine]\ndense = "tests.envelope_kernels:upto_128"\n'
    got = reason(tmp_path, "window = true", case(window=(8, 0)), body)
    assert got == (
        f"no sliding window: declared window = true in {TABLE}, but the signature of "
        f"tests.envelope_kernels:upto_128 does not allow it"
    )
    # and a declared false narrows what the signature allows (attend takes window_size)
    assert reason(tmp_path, "window = true", case(window=(8, 0))) is None
    assert (
        reason(tmp_path, "window = false", case(window=(8, 0)))
        == f"declared: no sliding window ({TABLE} window = false)"
    )


def test_a_plain_function_takes_the_declaration_of_its_quoted_table(tmp_path):
    spec = "tests.envelope_kernels:attend"
    config = load_config(
        write(tmp_path, f'[tool.attn-gate.kernels."{spec}"]\nsupports = {{head_dims = {{max = 64}}}}\n')
    )
    adapter = kernel_entry(spec, config).adapter()
    assert adapter.unsupported_reason(case(), "cpu") is None
    assert (
        adapter.unsupported_reason(case(head_dim=128, head_dim_v=128), "cpu")
        == f'declared: head_dim 128 (supports <= 64) ([tool.attn-gate.kernels."{spec}".supports] head_dims)'
    )
    # without a config the same function has its signature's envelope only
    assert kernel_entry(spec).adapter().unsupported_reason(case(head_dim=128, head_dim_v=128), "cpu") is None


def test_the_declaration_is_asked_before_the_family_has_an_entry_point(tmp_path):
    varlen = case(seqlen_q=8, seqlen_k=8, batch=2, varlen=(3, 8))
    assert reason(tmp_path, "varlen = false", varlen) == f"declared: no varlen ({TABLE} varlen = false)"


def test_kernels_lists_the_declared_envelope_in_the_same_keys(tmp_path, capsys):
    path = write(tmp_path, FAMILY + 'supports = {dtypes = ["fp16"], gqa = false, head_dims = {max = 128}}\n')
    with contextlib.chdir(ROOT):
        assert main(["kernels", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f'declared {TABLE}: dtypes = ["fp16"]; head_dims = {{ max = 128 }}; gqa = false' in out
    envelope = next(line for line in out.splitlines() if "envelope:" in line)
    assert (
        'dtypes = ["fp16"]' in envelope
        and "head_dims = { max = 128 }" in envelope
        and "gqa" in envelope.split("off:")[1]
    )


# ---------------------------------------------------------------- skipping costs nothing


def test_declared_skips_never_reach_a_worker(tmp_path, monkeypatch):
    """The isolated sweep decides a declared SKIP from the plan: the pool runs only the rest."""
    from gate.workflow import sweep as sweep_mod
    from gate.workflow.isolation import KernelInfo
    from gate.workflow.plan import plan_run

    body = (
        FAMILY
        + "supports = {head_dims = {max = 64}}\n"
        + """
[tool.attn-gate.suites.tiny]
seeds = [0]
[[tool.attn-gate.suites.tiny.matrix]]
seqlens = ["16"]
heads = ["2"]
head_dims = ["32", "64", "128"]
"""
    )
    config = load_config(write(tmp_path, body))
    sent = []

    class FakePool:
        slots = [0]

        def kernel_info(self):
            return KernelInfo(
                version="0",
                devices=("cpu",),
                unavailable=None,
                notes=(),
                returns_lse=False,
                sink_grad=True,
                backward=True,
            )

        def triage(self, cases):  # the adapter's own skips: none for this kernel
            return {}

        def run_case(self, c, *args):
            from gate.core.results import CaseResult

            sent.append(c.head_dim)
            return CaseResult(case=c, status=Status.PASS)

    @contextlib.contextmanager
    def fake_pool(*args, **kwargs):
        yield FakePool()

    monkeypatch.setattr(sweep_mod, "worker_pool", fake_pool)
    plan = plan_run(config, "mine", "tiny", "cpu", options=sweep_mod.SweepOptions(workers=1))
    result = sweep_mod.sweep_plan(plan, progress=False)
    assert sorted(sent) == [32, 64]
    skipped = [c for c in result.cases if c.status is Status.SKIP]
    assert [c.case.head_dim for c in skipped] == [128]
    assert skipped[0].reason == f"declared: head_dim 128 (supports <= 64) ({TABLE} head_dims)"


def test_a_declared_skip_is_never_timed_either(tmp_path):
    """The speed check's worker answers a case outside the envelope without starting (pool None here)."""
    from gate.core.config import IsolationConfig
    from gate.workflow.isolation import PerfWorker

    config = load_config(write(tmp_path, FAMILY + "supports = {gqa = false}\n"))
    worker = PerfWorker("mine", "cpu", IsolationConfig(), config.kernels["mine"])
    got = worker.measure(case(heads_kv=1), "sdpa-math", None)
    assert got.status is Status.SKIP and got.reason == f"declared: no GQA/MQA ({TABLE} gqa = false)"
    assert worker.pool is None


def test_the_skip_count_names_each_declared_key_apart():
    from types import SimpleNamespace

    from gate.report.check_report import skipped_by_reason

    decl = Capabilities.from_declaration(
        check_supports({"gqa": False, "head_dims": {"max": 128}, "causal": False}, "t"), TABLE
    )
    cases = [case(heads_kv=1), case(heads_kv=1), case(head_dim=256, head_dim_v=256), case(causal=True)]
    rows = [SimpleNamespace(status=Status.SKIP, reason=decl.unsupported_reason(c, "cpu")) for c in cases]
    rows.append(SimpleNamespace(status=Status.SKIP, reason="no sliding window: SDPA has none"))
    rows.append(SimpleNamespace(status=Status.PASS, reason=None))
    assert skipped_by_reason(SimpleNamespace(cases=rows)) == [
        ("declared gqa = false", 2),
        ("declared causal = false", 1),
        ("declared head_dims", 1),
        ("no sliding window", 1),
    ]
    from gate.kernels.capabilities import declared_key, declared_refusal

    quoted = '[tool.attn-gate.kernels."pkg.mod:fn".supports]'
    assert declared_key(declared_refusal("head_dim 96 (supports 64, 128)", quoted, "head_dims")) == "head_dims"
    assert declared_key("declared nothing: no sliding window (SDPA)") is None
