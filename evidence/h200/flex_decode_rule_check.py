"""Offline check of the flex-decoding rule against every flex case the H200 sweeps ran (all of pr in
reports/h200/session-2026-12-01c, its re-runs and all of nightly in 2026-12-01d, e, f, a later run
winning): does the rule predict exactly the Inductor
`NoValidChoicesError` rows? CPU only, reads the committed journals; no torch needed.

The rule (flex_compile_repro.py's `rule_of`, read in torch's torch/_inductor/kernel/flex/flex_decoding.py;
pytorch PR #185349 "Fix flex decoding BLOCK_M validation for short GQA"): a flex call with a block mask,
a query shorter than 128 rows and a power-of-two GQA group g goes to the flex-decoding kernel, whose M
tile packs the group: BLOCK_M = next_power_of_2(q_len * g), at least 16. Every config is dropped when
BLOCK_M does not divide the block mask's 128-row Q block, i.e. when q_len * g > 128. The gate's flex
adapter runs a varlen batch as one call per non-empty sequence, so a varlen case fails when any of its
sequences does. Flex-decoding is taken only with a one-head block mask under GQA (a per-head one
falls back to the main kernel: pytorch PR #148857), so a case counts as masked when it is causal,
windowed, decodes from a cache (its length mask), or carries a boolean bias whose mask has one head
(`document`, `prefix_lm`; `bool_mask` and `bool_empty_rows` are per head); a float bias is a score_mod
only. The rule was read in torch 2.13's source; the H200 ran torch 2.11. Its controls in the data: 17-long
sequences at group 4 (68) compile, 17 at group 8 (136) do not, and the unmasked and MHA cases compile.

    python3 evidence/h200/flex_decode_rule_check.py
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PR_SWEEP = "reports/h200/session-2026-12-01c/fanout/flex-pr/sweep-flex-pr.json.gz"
ONE_HEAD_BOOL_BIAS = ("document", "prefix_lm")  # gate/attention/bias.py bias_shape: (b, 1, nq, nk)


def sweep_rows(path: str) -> dict:
    """(suite, case id) -> result, from one sweep JSON (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(ROOT / path, "rt") as fh:
        sweep = json.load(fh)
    return {(sweep["suite"], c["case_id"]): c for c in sweep["cases"]}


def journal_rows(pattern: str) -> dict:
    """(suite, case id) -> the journalled result of the flex kernel. Paths are read in sorted order, which
    is session order (2026-12-01d < e < f): a later session's re-run of a case replaces the earlier row."""
    rows = {}
    for path in sorted(glob.glob(str(ROOT / pattern), recursive=True)):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
        if not lines or lines[0].get("kernel") != "flex":
            continue
        suite = lines[0]["suite"]
        for r in lines[1:]:
            if "case_id" in r:
                rows[(suite, r["case_id"])] = r
    return rows


def query_lengths(case: dict) -> list[int]:
    """Each flex call's query length: one per varlen sequence (the adapter calls per sequence), else seqlen_q."""
    return list(case["varlen"]) if case.get("varlen") else [case["seqlen_q"]]


def decode_block_m(q_len: int, group: int) -> int | None:
    """The packed BLOCK_M of flex-decoding for one masked call, next_power_of_2(q_len * group) (>= 16),
    or None where flex-decoding is not taken (q_len not under 128, or a group not a power of two).
    The lowering fails when it is over 128. flex_compile_repro.py labels its rows with this too."""
    if not 0 < q_len < 128 or group & (group - 1):
        return None
    return max(16, 1 << (q_len * group - 1).bit_length())


def predicts_no_valid_choices(case: dict) -> bool:
    """The rule of the module docstring: some call of the case lowers to flex-decoding with a one-head block
    mask and a packed BLOCK_M that the 128-row Q block cannot hold."""
    masked = (case["causal"] or tuple(case["window"]) != (-1, -1) or case.get("bias") in ONE_HEAD_BOOL_BIAS
              or case.get("entry") == "kvcache")
    group = case["heads_q"] // case["heads_kv"]
    return masked and any((decode_block_m(n, group) or 0) > 128 for n in query_lengths(case))


def main() -> None:
    rows = sweep_rows(PR_SWEEP)  # all of pr (2026-12-01c), then the re-runs and the nightly over it
    rows.update(journal_rows("reports/h200/session-2026-12-01[def]/journals/**/*.jsonl*"))
    table, misses = collections.Counter(), []
    for (suite, case_id), r in sorted(rows.items()):
        observed = "NoValidChoicesError" in (r.get("reason") or "")
        predicted = predicts_no_valid_choices(r["case"])
        table[(predicted, observed)] += 1
        if predicted != observed:
            misses.append(f"  {suite} {case_id}: predicted {predicted}, {r['status']} {(r.get('reason') or '')[:90]}")
    print(f"{len(rows)} flex case results: all of pr (2026-12-01c) and nightly (2026-12-01d/e/f), a later re-run winning")
    print("| predicted NoValidChoicesError | observed | cases |\n|---|---|---|")
    for (p, o), n in sorted(table.items()):
        print(f"| {p} | {o} | {n} |")
    print("cases where they differ:" if misses else "no case where they differ")
    print("\n".join(misses))


if __name__ == "__main__":
    main()
