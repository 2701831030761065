"""Smoke holds a case of every planted bug's axis in the envelopes strangers' kernels commonly
declare (no GQA path; bf16/fp16 at head dims 64 and 128; a causal mask aligned top-left; causal
attention only), so their
CPU selftest can kill every bug it plants in them. Decided as the selftest decides (host,
exercising cases), without running."""

from __future__ import annotations

import pytest

from gate.core.config import load_config
from gate.correctness.planted import BUGS, host_of
from gate.kernels.registry import kernel_entry
from gate.kernels.tiled import TiledAdapter
from gate.workflow.selftest import exercising_cases

KERNEL = "tests.envelope_kernels:upto_128"  # no window or softcap keyword: those cases SKIP
ENVELOPES = {
    "no GQA": "gqa = false",
    "bf16/fp16 at 64 and 128": 'dtypes = ["bf16", "fp16"]\nhead_dims = [64, 128]',
    "both": 'gqa = false\ndtypes = ["bf16", "fp16"]\nhead_dims = [64, 128]',
    "causal aligned top-left": "causal_seqlen_q_ne_k = false",
    "causal only": "non_causal = false",
}


@pytest.mark.parametrize("envelope", ENVELOPES)
def test_every_bug_planted_in_a_narrow_kernel_has_a_smoke_case_it_runs(tmp_path, envelope):
    path = tmp_path / "pyproject.toml"
    path.write_text(f'[tool.attn-gate.kernels."{KERNEL}".supports]\n{ENVELOPES[envelope]}\n')
    config = load_config(path)
    kernel = kernel_entry(KERNEL, config).adapter()
    cases = config.suite("smoke").swept_cases
    unexercised = []
    for bug in BUGS:
        if bug.trigger.pending or host_of(bug, kernel, cases) != "kernel":
            continue
        if not exercising_cases(bug, cases, kernel, "cpu") and (bug.needs is None or bug.needs(kernel.capabilities())):
            unexercised.append(bug.name)
    assert unexercised == [], unexercised
    # and the tiled-hosted ones run in tiled, as always
    tiled = TiledAdapter()
    assert all(
        exercising_cases(bug, cases, tiled, "cpu")
        for bug in BUGS
        if not bug.trigger.pending and host_of(bug, kernel, cases) == "tiled"
    )
