"""Offline check of the flex-decoding rule against every flex case the H200 sweeps ran (all of pr in
reports/h200/session-2026-12-01c, its re-runs and all of nightly in 2026-12-01d, e, f, re-runs in g, h, a
later run winning): does the rule predict exactly the Inductor
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
sequences at group 4 (68) compile, 17 at group 8 (136) do not, and the masked MHA cases compile.

A second rule, for the same kernel's shared memory (found in these data on 2026-12-01g): an UNMASKED call
takes flex-decoding too (flex gives it a one-head block mask whose Q block is 2**30 rows, which any BLOCK_M
divides), so nothing caps BLOCK_M, and the kernel keeps the whole packed Q tile in shared memory: BLOCK_M x
the head dim rounded up to a power of two x the element size. Every config fails ("No valid triton
configs. OutOfMemoryError: out of resource") when that tile alone exceeds the H200's 232,448 bytes per
block, e.g. q_len 97 at group 16 (BLOCK_M 2048) from head dim 64, 127 at group 8 (1024) from head dim 72,
97 or 127 at group 4 (512) from head dim 160. The "Required" size in each of the 20 observed messages is
this tile plus one 64-row V tile, (BLOCK_M x rounded qk dim + 64 x rounded v dim) x 2 bytes, exactly. A
masked call cannot get there: its BLOCK_M is at most 128. Some of these compiles never reach their error
within the sweep's 300 s case timeout; they are counted as predicted, ended by the timeout (plain flex
reached the error on one of them, q97 16/1 d128, after 496 s: flex_compile_repro.py REPRO_SET=smem, 2026-12-01h).

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
PER_HEAD_BOOL_BIAS = ("bool_mask", "bool_empty_rows")  # (b, h, nq, nk): GQA falls back to the main kernel
SHARED_MEMORY_BYTES = 232_448  # the H200's per-block limit, as Triton's out-of-resource message gives it
SESSIONS = "reports/h200/session-2026-12-01[defgh]/journals/**/*.jsonl*"


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


def one_head_mask(case: dict) -> bool:
    """Whether the case's flex calls carry a block mask with one head (causal, window, cache lengths, a
    one-head bool bias); a float bias is a score_mod only."""
    return bool(case["causal"] or tuple(case["window"]) != (-1, -1) or case.get("bias") in ONE_HEAD_BOOL_BIAS
                or case.get("entry") == "kvcache")


def predicts_no_valid_choices(case: dict) -> bool:
    """The rule of the module docstring: some call of the case lowers to flex-decoding with a one-head block
    mask and a packed BLOCK_M that the 128-row Q block cannot hold."""
    group = case["heads_q"] // case["heads_kv"]
    return one_head_mask(case) and any((decode_block_m(n, group) or 0) > 128 for n in query_lengths(case))


def decode_q_tile_bytes(q_len: int, group: int, head_dim: int, element_bytes: int) -> int | None:
    """The packed Q tile flex-decoding keeps in shared memory, BLOCK_M x head_dim rounded up to a power of two
    x the element size, or None where flex-decoding is not taken. flex_compile_repro.py labels rows with it."""
    block_m = decode_block_m(q_len, group)
    return None if block_m is None else block_m * (1 << (head_dim - 1).bit_length()) * element_bytes


def predicts_shared_memory_failure(case: dict) -> bool:
    """The second rule of the module docstring: some unmasked call of the case lowers to flex-decoding with a
    packed Q tile over the shared memory of a block (a masked one fails the first rule before it gets there;
    a per-head bool mask under GQA goes to the main kernel)."""
    group = case["heads_q"] // case["heads_kv"]
    if one_head_mask(case) or (case.get("bias") in PER_HEAD_BOOL_BIAS and group > 1):
        return False
    element_bytes = 4 if case["dtype"] == "fp32" else 2
    return any((decode_q_tile_bytes(n, group, case["head_dim"], element_bytes) or 0) > SHARED_MEMORY_BYTES
               for n in query_lengths(case))


def table(rows: dict, predict, observe, title: str) -> None:
    """Print predicted x observed counts and every case where they differ."""
    counts, misses = collections.Counter(), []
    for (suite, case_id), r in sorted(rows.items()):
        observed, predicted = observe(r), predict(r["case"])
        counts[(predicted, observed)] += 1
        if predicted != observed:
            misses.append(f"  {suite} {case_id}: predicted {predicted}, {r['status']} {(r.get('reason') or '')[:90]}")
    print(f"| predicted {title} | observed | cases |\n|---|---|---|")
    for (p, o), n in sorted(counts.items(), key=str):
        print(f"| {p} | {o} | {n} |")
    print("cases where they differ:" if misses else "no case where they differ")
    print("\n".join(misses))


def shared_memory_outcome(r: dict) -> str | bool:
    """True for Inductor's out-of-resource ERROR, 'timeout' for a case the sweep's case timeout ended, else
    False. A SKIP never ran (the capability declarations quote that message as their reason)."""
    reason = r.get("reason") or ""
    if r["status"] == "ERROR" and "--case-timeout" in reason:
        return "timeout"
    return r["status"] == "ERROR" and "No valid triton configs" in reason


def main() -> None:
    rows = sweep_rows(PR_SWEEP)  # all of pr (2026-12-01c), then the re-runs and the nightly over it
    rows.update(journal_rows(SESSIONS))
    print(f"{len(rows)} flex case results: all of pr (2026-12-01c) and nightly (2026-12-01d/e/f, re-runs g/h), a later re-run winning")
    table(rows, predicts_no_valid_choices, lambda r: "NoValidChoicesError" in (r.get("reason") or ""),
          "NoValidChoicesError")
    print()
    table(rows, predicts_shared_memory_failure, shared_memory_outcome,
          "shared-memory failure")


if __name__ == "__main__":
    main()
