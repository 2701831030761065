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
sequences does; a case has a block mask when it is causal, windowed, decodes from a cache, or carries a
boolean bias (a float bias is a score_mod only).

    python3 evidence/h200/flex_decode_rule_check.py
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PR_SWEEP = "reports/h200/session-2026-12-01c/fanout/flex-pr/sweep-flex-pr.json.gz"
BOOL_BIAS = ("bias.bool_mask", "bias.bool_empty_rows", "bias.document", "bias.prefix_lm")


def sweep_rows(path: str) -> dict:
    """(suite, case id) -> result, from one sweep JSON (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(ROOT / path, "rt") as fh:
        sweep = json.load(fh)
    return {(sweep["suite"], c["case_id"]): c for c in sweep["cases"]}


def journal_rows(pattern: str) -> dict:
    """(suite, case id) -> the last journalled result of the flex kernel (a later re-run wins)."""
    rows = {}
    for path in sorted(glob.glob(str(ROOT / pattern), recursive=True)):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as fh:
            lines = [json.loads(line) for line in fh if line.strip()]
        if not lines or lines[0].get("kernel") != "flex":
            continue
        suite = "pr" if "-pr" in Path(path).parts[-3] else "nightly"
        for r in lines[1:]:
            if "case_id" in r:
                rows[(suite, r["case_id"])] = r
    return rows


def query_lengths(case_id: str, case: dict) -> list[int]:
    """Each call's query length: the varlen sequences of the id (q side), else the case's seqlen_q."""
    m = re.search(r"-varlen([\d.]+)", case_id)
    return [int(x) for x in m.group(1).split(".")] if m else [case["seqlen_q"]]


def predicts_no_valid_choices(case_id: str, case: dict) -> bool:
    masked = (case["causal"] or tuple(case["window"]) != (-1, -1) or any(b in case_id for b in BOOL_BIAS)
              or case.get("entry") in ("kvcache",) or "-cache" in case_id)
    group = case["heads_q"] // case["heads_kv"]
    if not masked or group & (group - 1):
        return False
    return any(0 < n < 128 and max(16, 1 << (n * group - 1).bit_length()) > 128 for n in query_lengths(case_id, case))


def main() -> None:
    rows = sweep_rows(PR_SWEEP)  # all of pr (2026-12-01c), then the re-runs and the nightly over it
    rows.update(journal_rows("reports/h200/session-2026-12-01[def]/journals/**/*.jsonl*"))
    table, misses = collections.Counter(), []
    for (suite, case_id), r in sorted(rows.items()):
        observed = "NoValidChoicesError" in (r.get("reason") or "")
        predicted = predicts_no_valid_choices(case_id, r["case"])
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
