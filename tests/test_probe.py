"""`attn-gate probe`: outcomes -> declaration (one fast test per rule), the declaration written into
pyproject.toml, and (slow) the probe of kernels with known envelopes (tests/envelope_kernels.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gate.core.cases import Case
from gate.core.config import load_config
from gate.core.errors import UserError
from gate.workflow.probe import (
    HEAD_DIMS,
    PROBED_KEYS,
    SEQLENS,
    Outcome,
    ProbeReport,
    Result,
    Trial,
    derive,
    with_declaration,
    write_declaration,
)

ROOT = Path(__file__).resolve().parent.parent
CASE = Case.build(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16")
OK, WRONG, OUT, REFUSED = Outcome.OK, Outcome.WRONG, Outcome.UNSUPPORTED, Outcome.REFUSED


def results(key: str, outcomes: dict) -> list[Result]:
    return [
        Result(Trial(key, value, CASE), outcome, "dq is 37x its bound" if outcome == WRONG else "")
        for value, outcome in outcomes.items()
    ]


# ---------------------------------------------------------------- derive: one rule each


def test_a_raise_past_a_head_dim_declares_its_max():
    got, _ = derive(results("head_dims", {d: OK if d <= 128 else OUT for d in HEAD_DIMS}))
    assert got == {"head_dims": {"max": 128}}


def test_scattered_head_dims_are_declared_as_the_list_that_ran():
    got, _ = derive(results("head_dims", {d: OK if d % 32 == 0 else OUT for d in HEAD_DIMS}))
    assert got == {"head_dims": [32, 64, 96, 128, 160, 192, 256]}


def test_every_dim_running_declares_nothing():
    assert derive(results("head_dims", {d: OK for d in HEAD_DIMS})) == ({}, [])


def test_dtypes_are_the_ones_that_ran_and_refused_ones_are_left_to_the_signature():
    got, _ = derive(results("dtypes", {"fp16": OK, "bf16": OUT, "fp32": OUT, "e4m3": REFUSED, "e5m2": REFUSED}))
    assert got == {"dtypes": ["fp16"]}
    assert derive(results("dtypes", {"fp16": OK, "bf16": OK, "fp32": OK, "e4m3": REFUSED}))[0] == {}


def test_lengths_failing_off_a_multiple_declare_the_multiple():
    got, notes = derive(results("seqlens", {n: OK if n % 128 == 0 else OUT for n in SEQLENS}))
    assert got == {"seqlen_multiple": 128} and notes == []


def test_lengths_failing_above_one_declare_the_max():
    got, _ = derive(results("seqlens", {n: OK if n <= 256 else OUT for n in SEQLENS}))
    assert got == {"max_seqlen": 256}


def test_lengths_failing_by_no_rule_are_a_finding_not_a_guess():
    got, notes = derive(results("seqlens", {n: OUT if n in (64, 192) else OK for n in SEQLENS}))
    assert got == {} and notes and "by no multiple: declare max_seqlen / seqlen_multiple by hand" in notes[0]


def test_an_unsupported_feature_is_declared_false():
    got, _ = derive(results("gqa", {2: OK, 1: OUT}))
    assert got == {"gqa": False}


def test_a_wrong_answer_stays_in_the_envelope_as_a_finding():
    got, findings = derive(results("gqa", {2: WRONG, 1: OK}))
    assert got == {}
    assert findings == ["gqa 2: runs but dq is 37x its bound: left in the envelope so the gate judges it"]
    # wrong only where causal meets unequal lengths: the finding says how the gate aligns the mask
    causal = Trial("causal_seqlen_q_ne_k", "128x256 causal", CASE.with_fields(seqlen_k=256, causal=True))
    _, findings = derive([Result(causal, WRONG, "out is 50x its bound")])
    assert "left in the envelope so the gate judges it (the gate aligns a causal mask bottom-right" in findings[0]
    assert findings[0].endswith("if that is its design, declare causal_seqlen_q_ne_k = false)")
    decode = Trial("kvcache", True, CASE.with_fields(seqlen_q=1, seqlen_k=256, causal=True))
    assert "bottom-right" not in derive([Result(decode, WRONG, "out is 50x its bound")])[1][0]


def test_a_raise_at_causal_unequal_lengths_is_blamed_on_the_mask_only_where_both_halves_ran():
    causal = Trial("causal", True, CASE.with_fields(causal=True))
    unequal = Trial("seqlen_q_ne_k", "128x256", CASE.with_fields(seqlen_k=256))
    both = Trial("causal_seqlen_q_ne_k", "128x256 causal", CASE.with_fields(seqlen_k=256, causal=True))
    raised = "ValueError: needs seqlen_q == seqlen_k"
    # only the causal mask needs equal lengths: the plain cases of unequal lengths stay in
    equal_only = [Result(causal, OK), Result(unequal, OK), Result(both, OUT, raised)]
    assert derive(equal_only)[0] == {"causal_seqlen_q_ne_k": False}
    no_unequal = [Result(causal, OK), Result(unequal, OUT, raised), Result(both, OUT, raised)]
    assert derive(no_unequal)[0] == {"seqlen_q_ne_k": False}
    no_causal = [Result(causal, OUT, "ValueError: no causal"), Result(unequal, OK), Result(both, OUT, "no causal")]
    assert derive(no_causal)[0] == {"causal": False}
    # a top-left mask answers wrong there: with the key its finding asks for written by hand, the
    # finding says it stays (it also covers windows and ALiBi, which the probe does not try unequal)
    top_left = [Result(causal, OK), Result(unequal, OK), Result(both, WRONG, "out is 50x its bound")]
    supports, findings = derive(top_left, {"causal_seqlen_q_ne_k": False})
    assert supports == {} and findings == [
        "causal_seqlen_q_ne_k 128x256 causal: runs but out is 50x its bound: declared causal_seqlen_q_ne_k = false, "
        "which stays"
    ]
    assert "causal_seqlen_q_ne_k" not in PROBED_KEYS  # probe() keeps the table's own value
    assert derive(top_left)[0] == {} and "bottom-right" in derive(top_left)[1][0]


def test_the_counts_name_the_calls_the_signature_refused():
    ran = [Result(Trial("dtypes", d, CASE), OK) for d in ("fp16", "bf16")]
    refused = [Result(Trial("window", w, CASE), REFUSED, "no window_size") for w in (16, 64)]
    out = [Result(Trial("head_dims", 256, CASE), OUT, "ValueError: head_dim > 64")]
    text = ProbeReport("k", "[t]", {}, (), tuple(ran + refused + out)).counts()
    assert text == "5 calls, 1 unsupported, 0 wrong, 2 refused by its signature (they SKIP, no declaration needed)", (
        text
    )
    assert ProbeReport("k", "[t]", {}, (), tuple(ran)).counts() == "2 calls, 0 unsupported, 0 wrong"


def test_a_kernel_that_runs_no_plain_case_is_told_the_convention_once():
    from gate.workflow.probe import no_plain_case

    detail = "TypeError: forward() got an unexpected keyword argument 'softmax_scale'"
    plain = [Result(Trial("dtypes", d, CASE), OUT, detail) for d in ("fp16", "bf16", "fp32")]
    text = no_plain_case("tutk:attention", plain)
    assert text.count(detail) == 1 and f"fp16, bf16, fp32: {detail}" in text, text
    assert "with q, k, v of shape (batch, seqlen, heads, head_dim)" in text and "another convention" in text
    plain[0] = Result(Trial("dtypes", "fp16", CASE), OUT, "TypeError: fp16 not supported")
    assert "fp16: TypeError: fp16 not supported; bf16, fp32: TypeError" in no_plain_case("k", plain)


def test_a_wrong_answer_just_past_its_bound_reads_as_past_it():
    from types import SimpleNamespace

    from gate.workflow.probe import outcome_of

    def row(*ratios):
        tensors = tuple(SimpleNamespace(tensor=t, ratio=r) for t, r in zip(("dq", "dk"), ratios))
        return SimpleNamespace(status=SimpleNamespace(value="FAIL"), tensors=tensors, reason="")

    trial = Trial("window", 16, CASE)
    assert outcome_of(trial, row(0.5, 1.04)) == Result(trial, WRONG, "dk is 1.04x its bound")
    assert outcome_of(trial, row(14121.3, 2.0)).detail == "dq is 14,121x its bound"


def test_a_refused_axis_is_the_signatures_and_declares_nothing():
    assert derive(results("window", {(16, 0): REFUSED}))[0] == {}


def test_bias_kinds_and_layouts_keep_the_untried_values():
    got, _ = derive(
        results("bias_kinds", {"dense": OK, "bool_mask": OUT}) + results("layouts", {"bhsd_view": OUT, "k_sliced": OK})
    )
    assert "bool_mask" not in got["bias_kinds"] and {"none", "dense", "growing"} <= set(
        got["bias_kinds"]
    )  # untried stay
    assert "contiguous" in got["layouts"] and "far_rows" in got["layouts"] and "bhsd_view" not in got["layouts"]


# ---------------------------------------------------------------- writing it


def report(kernel="pkg.mod:fn", supports=None) -> ProbeReport:
    table = (
        f'[tool.attn-gate.kernels."{kernel}".supports]'
        if ":" in kernel
        else f"[tool.attn-gate.kernels.{kernel}.supports]"
    )
    return ProbeReport(
        kernel=kernel,
        table=table,
        supports=supports or {"head_dims": {"max": 128}, "gqa": False},
        findings=(),
        results=(),
    )


def test_write_appends_the_table_and_it_reads_back(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n\n[tool.attn-gate]\nbaselines_dir = "b"\n')
    write_declaration(path, report())
    assert load_config(path).kernels["pkg.mod:fn"].supports == {"head_dims": {"max": 128}, "gqa": False}
    write_declaration(path, report(supports={"dtypes": ["fp16"]}))  # a second probe replaces the table
    text = path.read_text()
    assert text.count(".supports]") == 1 and "gqa" not in text
    assert load_config(path).kernels["pkg.mod:fn"].supports == {"dtypes": ["fp16"]}


def test_write_replaces_a_familys_table_and_keeps_what_follows(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[tool.attn-gate.kernels.mine]\ndense = "a.b:c"\n\n[tool.attn-gate.kernels.mine.supports]\n'
        'gqa = true\n\n[tool.attn-gate.cpu]\nsuite = "smoke"\n'
    )
    write_declaration(path, report("mine"))
    config = load_config(path)
    assert config.kernels["mine"].supports == {"head_dims": {"max": 128}, "gqa": False}
    assert config.kernels["mine"].dense == "a.b:c" and config.cpu.suite == "smoke"


def test_write_refuses_a_symlink_and_an_inline_table_and_writes_nothing(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text("[tool.attn-gate]\n")
    link = tmp_path / "pyproject.toml"
    link.symlink_to(real)
    with pytest.raises(UserError, match="is a symlink; write through the real file"):
        write_declaration(link, report())
    assert real.read_text() == "[tool.attn-gate]\n" and link.is_symlink()
    inline = tmp_path / "inline.toml"
    body = '[tool.attn-gate.kernels.mine]\ndense = "a.b:c"\nsupports = {gqa = true}\n'
    inline.write_text(body)
    with pytest.raises(UserError, match="written inline"):
        write_declaration(inline, report("mine"))
    assert inline.read_text() == body


def test_write_refuses_a_file_that_would_not_load_and_leaves_it(tmp_path):
    path = tmp_path / "pyproject.toml"
    body = "[tool.attn-gate]\nunknown_key = 1\n"
    path.write_text(body)
    with pytest.raises(UserError, match="unknown key 'unknown_key'"):
        write_declaration(path, report())
    assert path.read_text() == body and [p.name for p in tmp_path.iterdir()] == ["pyproject.toml"]


def test_with_declaration_is_valid_toml_at_the_end_of_a_file_without_newline():
    text = with_declaration('[project]\nname = "x"', report(), "f")
    assert tomllib.loads(text)["tool"]["attn-gate"]["kernels"]["pkg.mod:fn"]["supports"]["gqa"] is False


def test_init_renders_a_probed_declaration_into_its_section():
    from gate.workflow.init import CiConfig, InitOptions, pyproject_section

    section = pyproject_section(InitOptions(kernel="pkg.mod:fn", supports={"dtypes": ["fp16"]}), CiConfig())
    assert '[tool.attn-gate.kernels."pkg.mod:fn".supports]\ndtypes = ["fp16"]\n' in section
    family = pyproject_section(
        InitOptions(family="mine", entries=(("dense", "a.b:c"),), supports={"gqa": False}), CiConfig()
    )
    assert "[tool.attn-gate.kernels.mine.supports]\ngqa = false\n" in family
    assert "supports]" not in pyproject_section(InitOptions(kernel="pkg.mod:fn"), CiConfig())


# ---------------------------------------------------------------- probing kernels of known envelopes (slow)


def probed(function: str, timeout: float = 30.0) -> ProbeReport:
    from gate.workflow.probe import probe

    return probe(f"tests.envelope_kernels:{function}", load_config(ROOT / "pyproject.toml"), "cpu", timeout)


@pytest.mark.slow
@pytest.mark.parametrize(
    "function, declaration",
    [
        ("attend", {}),
        ("upto_128", {"head_dims": {"max": 128}}),
        ("fp16_only", {"dtypes": ["fp16"]}),
        ("multiple_of_128", {"seqlen_multiple": 128}),
        ("no_gqa", {"gqa": False}),
    ],
)
def test_the_probe_finds_the_known_envelope(function, declaration):
    got = probed(function)
    assert got.supports == declaration
    assert got.findings == ()


@pytest.mark.slow
def test_a_causal_mask_for_equal_lengths_only_is_found_and_a_top_left_one_is_named():
    assert probed("causal_equal_lengths").supports == {"causal_seqlen_q_ne_k": False}
    got = probed("top_left_causal")
    assert got.supports == {} and len(got.findings) == 1, got.findings
    assert got.findings[0].startswith("causal_seqlen_q_ne_k 128x256 causal: runs but ")
    assert "bottom-right" in got.findings[0]


def dtype_calls(**outcomes: str) -> list[Result]:
    """The dtype calls in the order the probe makes them (DTYPES'), wrong ones with dv 394x."""
    return [
        Result(Trial("dtypes", d, CASE.with_fields(dtype=d)), o, "dv is 394x its bound" if o == WRONG else "")
        for d, o in outcomes.items()
    ]


AXES = (
    results("head_dims", {64: WRONG, 128: WRONG, 96: OUT})
    + results("causal", {True: OK})
    + results("layouts", {"k_sliced": WRONG})
    + results("gqa", {"4/2 heads": OUT})
)
TOP_LEFT = Result(Trial("causal_seqlen_q_ne_k", "128x256 causal", CASE), WRONG, "out is 50x its bound")


def test_a_wrong_plain_call_is_one_finding_naming_what_inherits_it_and_what_runs_right():
    supports, findings = derive([*dtype_calls(fp16=WRONG, bf16=OUT, fp32=WRONG), *AXES, TOP_LEFT])
    assert supports["head_dims"] == [64, 128] and supports["gqa"] is False and "bf16" not in supports["dtypes"]
    assert findings[0] == (
        f"the plain call ({CASE.with_fields(dtype='fp16').id}) runs but dv is 394x its bound, as at dtypes fp32, and so "
        "do 3 calls built on it (head_dims 64, 128; layouts k_sliced); what runs right differs from it in: "
        "causal: left in the envelope so the gate judges it"
    )
    # a causal call that runs right: the one at unequal lengths is its mask's alignment, said apart
    assert len(findings) == 2 and findings[1].startswith("causal_seqlen_q_ne_k 128x256 causal: runs but ")


def test_the_plain_call_is_the_one_the_other_calls_are_built_on():
    # fp16 is called first and runs right: the other calls are fp16 calls, a wrong bf16 is its own finding
    _, findings = derive([*dtype_calls(fp16=OK, bf16=WRONG, fp32=OK), *AXES])
    assert findings[0].startswith("dtypes bf16: runs but dv is 394x its bound") and len(findings) == 4
    _, findings = derive([*dtype_calls(fp16=WRONG, bf16=OK, fp32=OK), *AXES])
    assert findings[0].startswith(f"the plain call ({CASE.with_fields(dtype='fp16').id}) runs but ")
    assert "what runs right differs from it in: dtypes bf16, fp32; causal:" in findings[0] and len(findings) == 1


def test_a_kernel_wrong_everywhere_says_no_call_runs_right_and_drops_the_alignment_note():
    everything = [r if r.outcome != OK else Result(r.trial, WRONG, "dq is 37x its bound") for r in AXES]
    _, findings = derive([*dtype_calls(fp16=WRONG), *everything, TOP_LEFT])
    (finding,) = findings
    assert "and so do 5 calls built on it" in finding and finding.endswith(
        "; no call runs right: left in the envelope so the gate judges it"
    )
    assert "bottom-right" not in finding


@pytest.mark.slow
def test_a_backward_written_for_causal_attention_is_one_finding_that_names_causal():
    got = probed("causal_backward")
    assert got.supports == {}
    (finding,) = got.findings
    assert finding.startswith("the plain call (fp16-b1-h2-s128-d64) runs but d"), finding
    assert ", as at dtypes bf16, fp32, and so do " in finding and " calls built on it (" in finding
    assert finding.endswith(
        "what runs right differs from it in: causal_seqlen_q_ne_k 128x256 causal; causal: "
        "left in the envelope so the gate judges it"
    ), finding


@pytest.mark.slow
def test_a_kernel_of_causal_attention_only_is_probed_causal_and_declared_so():
    got = probed("causal_only")
    assert got.supports == {"non_causal": False}, got.supports
    assert got.findings == ()
    # every call along the other axes was made with the mask, and ran
    axes = [r for r in got.results if r.trial.key not in ("dtypes", "non_causal")]
    assert axes and all(r.trial.case.causal for r in axes if r.outcome != Outcome.REFUSED)
    assert {r.outcome for r in got.results if r.trial.key == "non_causal" and r.trial.value in ("fp16", "bf16")} == {
        OUT
    }


@pytest.mark.slow
def test_a_kernel_silently_wrong_on_gqa_keeps_gqa_and_the_finding_says_so():
    got = probed("wrong_on_gqa")
    assert got.supports == {}
    assert len(got.findings) == 1
    assert (
        got.findings[0].startswith("gqa 4/2 heads: runs but ")
        and "x its bound: left in the envelope so the gate judges it" in got.findings[0]
    )


@pytest.mark.slow
def test_a_hang_is_timed_out_and_declared_unsupported():
    # a short per-trial timeout: the hang costs it once; every other trial takes milliseconds
    got = probed("hangs_on_window", timeout=4.0)
    assert got.supports == {"window": False}
    hung = [r for r in got.results if r.trial.key == "window"]
    assert hung[0].outcome == Outcome.UNSUPPORTED and "timed out after 4 s" in hung[0].detail, hung[0].detail
    # the trials after the hang ran in a fresh worker
    assert [r.outcome for r in got.results if r.trial.key == "layouts"] == [OK] * len(
        [r for r in got.results if r.trial.key == "layouts"]
    )


@pytest.mark.slow
def test_a_kernel_that_raises_keeps_its_worker_and_its_compiles(tmp_path, monkeypatch):
    """Three raising head dims cost no worker start: every call that ran, ran in one process (a
    kernel that compiles on its first call in a process compiles once)."""
    log = tmp_path / "pids"
    monkeypatch.setenv("ENVELOPE_KERNEL_LOG", str(log))
    got = probed("upto_128")
    assert got.supports == {"head_dims": {"max": 128}}
    assert [r.outcome for r in got.results if r.trial.key == "head_dims"].count(OUT) == 3
    pids = log.read_text().split()
    assert len(pids) > 20 and len(set(pids)) == 1, pids


@pytest.mark.slow
def test_a_raise_that_changed_its_process_gets_a_fresh_worker(tmp_path, monkeypatch):
    """A kernel that turns autograd off and then raises: the worker's state check retires it, so
    the trials after it run with autograd on, in another process, and pass."""
    log = tmp_path / "pids"
    monkeypatch.setenv("ENVELOPE_KERNEL_LOG", str(log))
    got = probed("fp16_only_grad_off")
    assert got.supports == {"dtypes": ["fp16"]} and got.findings == ()
    pids = log.read_text().split()
    assert pids[0] != pids[-1] and pids[1:].count(pids[-1]) == len(pids) - 1, pids


@pytest.mark.slow
def test_probe_write_from_the_cli_then_the_gate_skips_outside_it(tmp_path, capsys, monkeypatch):
    from tests.minisuite import gate

    monkeypatch.setenv("COLUMNS", "60")  # the summary line wraps at the terminal's width
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.attn-gate]\nbaselines_dir = "baselines"\n')
    probe = ["probe", "tests.envelope_kernels:upto_128", "--config", str(path), "--device", "cpu"]
    assert gate([*probe, "--write", "-q", "--timeout", "30"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert '[tool.attn-gate.kernels."tests.envelope_kernels:upto_128".supports]\nhead_dims = { max = 128 }\n' in out
    summary = out.split("\n\n")[0].splitlines()
    assert len(summary) > 1 and max(map(len, summary)) <= 60 and summary[0].startswith("probed "), out
    family = load_config(path).kernels["tests.envelope_kernels:upto_128"]
    assert family.supports == {"head_dims": {"max": 128}}
    # a key the probe does not look for, added by hand, survives a re-probe; a probed one is redone
    path.write_text(path.read_text().replace("head_dims = { max = 128 }", "head_dims = [64]\nmax_batch_heads = 65535"))
    assert gate([*probe, "--write", "-q", "--timeout", "30"]) == 0, capsys.readouterr().err
    family = load_config(path).kernels["tests.envelope_kernels:upto_128"]
    assert family.supports == {"head_dims": {"max": 128}, "max_batch_heads": 65535}
    assert gate(["probe", "tests.envelope_kernels:upto_128", "--timeout", "0"]) == 2
    assert "--timeout 0.0: give seconds > 0" in capsys.readouterr().err


def test_write_refuses_a_built_in_kernels_table(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.attn-gate]\n")
    with pytest.raises(UserError, match="'tiled' is a built-in kernel"):
        write_declaration(path, report("tiled"))
    assert path.read_text() == "[tool.attn-gate]\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "function, counts, printed, supports",
    [
        ("no_gqa", "2 unsupported, 0 wrong", "; the envelope goes into\n  {table}:\n    gqa = false\n", {"gqa": False}),
        (
            "attend",
            "0 unsupported, 0 wrong",
            "; the envelope goes into\n  {table}:\n    (empty: every probed axis runs",
            {},
        ),
        # a wrong answer is a finding, wrapped as the rest
        ("top_left_causal", "0 unsupported, 1 wrong", "probe finding: causal_seqlen_q_ne_k 128x256 causal:", {}),
    ],
)
def test_init_probe_prints_and_writes_the_found_envelope(
    tmp_path, capsys, monkeypatch, function, counts, printed, supports
):
    """What init writes is printed beneath the probe's line, so the first baseline's SKIPs are expected;
    the line wraps at the terminal's width."""
    from gate.commands.main import main

    monkeypatch.setenv("COLUMNS", "80")

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "attn.py").write_text((ROOT / "tests" / "envelope_kernels.py").read_text())
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n')
    assert (
        main(
            [
                "init",
                "--dir",
                str(tmp_path),
                "--kernel",
                f"mypkg.attn:{function}",
                "--probe",
                "--yes",
                "--repository",
                "a/b",
                "--owners",
                "@a/b",
                "--install",
                "attn-gate==0.1.0",
            ]
        )
        == 0
    )
    table = f'[tool.attn-gate.kernels."mypkg.attn:{function}".supports]'
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert max(map(len, lines)) <= 80, captured.out
    start = next(i for i, ln in enumerate(lines) if ln.startswith("probe: "))
    end = next(i for i in range(start, len(lines)) if lines[i].endswith("the envelope goes into"))
    line = " ".join(ln.strip() for ln in lines[start : end + 1])
    assert printed.format(table=table) in "\n".join([*lines[:start], line, *lines[end + 1 :]])
    # the keywords the function does not take are counted apart from what it failed on
    assert re.fullmatch(
        rf"probe: \d+ calls, {counts}, \d+ refused by its signature \(they SKIP, no declaration needed\); the envelope goes into",
        line,
    )
    # each call was shown on stderr as it finished, as `attn-gate probe` shows it
    calls = int(re.search(r"probe: (\d+) calls", captured.out).group(1))
    shown = [
        line for line in captured.err.splitlines() if re.match(r"  (runs|unsupported|refused|WRONG) +\S+ \S", line)
    ]
    assert len(shown) == calls, captured.err
    config = load_config(tmp_path / "pyproject.toml")
    assert config.kernels[f"mypkg.attn:{function}"].supports == supports


@pytest.mark.slow
def test_a_family_is_probed_without_its_old_declaration(tmp_path):
    from gate.workflow.probe import probe

    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[tool.attn-gate.kernels.mine]\ndense = "tests.envelope_kernels:no_gqa"\n'
        '[tool.attn-gate.kernels.mine.supports]\ndtypes = ["fp16"]\n'
    )
    got = probe("mine", load_config(path), "cpu", 30.0)
    assert got.supports == {"gqa": False} and got.table == "[tool.attn-gate.kernels.mine.supports]"
    write_declaration(path, got)
    assert load_config(path).kernels["mine"].supports == {"gqa": False}
