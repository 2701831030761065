"""What `attn-gate COMMAND --help` says besides the options: what the command is for, two
or three examples to copy, and its exit codes. Kept in one place so every command reads alike."""

from __future__ import annotations

import argparse

EXIT_2 = "2  usage or environment error (unknown kernel/suite, bad file or option); the message names the fix"

HELP: dict[str, tuple[str, list[str], list[str]]] = {
    # name: (description, examples, exit codes)
    "check": (
        "The gate: run the sweep (and, with a GPU, the speed check) and compare it with the committed "
        "baseline baselines/<gpu-class>/<kernel>-<suite>.json. Writes the PR comment "
        "(comment-<kernel>-<suite>.md), findings JSON, sweep JSON and plots to --out.",
        [
            "attn-gate check                                   # the configured kernel and suite",
            "attn-gate check --kernel sdpa-cpu --suite smoke --device cpu --only causal",
            "attn-gate check --last-failed                     # rerun what failed in the last check in out/",
            "attn-gate check --results out/sweep-sdpa-flash-pr.json   # judge a CI artifact",
            "attn-gate check --results merged/sweep-fa4-nightly.json --perf-results perf/perf-*.json   # and its speed",
        ],
        [
            "0  pass (warnings may still ask for a look)",
            "1  fail: a case out of bounds, a regression, or an inconclusive measurement",
            EXIT_2,
        ],
    ),
    "baseline": (
        "Rewrite or print the committed baseline of this GPU class.",
        [
            "attn-gate baseline update --kernel sdpa-cpu --suite smoke --device cpu",
            "attn-gate baseline show --device cpu --only causal",
        ],
        [
            "0  written / shown",
            "1  refused: a case fails that no [[tool.attn-gate.known_failures]] declaration covers",
            EXIT_2,
        ],
    ),
    "baseline update": (
        "Rerun the suite (or read --from-results) and rewrite baselines/<gpu-class>/<kernel>-<suite>.json "
        "atomically; prints what moved, for the PR that commits it.",
        [
            "attn-gate baseline update --kernel sdpa-cpu --suite smoke --device cpu",
            "attn-gate baseline update --from-results out/sweep-sdpa-flash-pr.json --summary body.md",
            'attn-gate baseline update --known "dq loses precision on shifted inputs"  # record the failures',
        ],
        [
            "0  written",
            "1  refused: a case fails that no known_failures declaration covers (nothing written; "
            "the message lists them with their reasons and the declaration to record them: "
            "docs/known-failures.md)",
            EXIT_2,
        ],
    ),
    "baseline carry": (
        "Bring baselines to their suites as defined now, with no run: after a suite lost cases or made "
        'some timing-only (perf = ["only"]), drop those rows and keep every other row as measured. Refused, '
        "naming the --only to measure, when a swept case is new or changed.",
        ["attn-gate baseline carry baselines/h200/*-pr.json"],
        ["0  carried (or matched already)", EXIT_2],
    ),
    "baseline show": (
        "Print a baseline: where and when it was measured and each case's error ratios.",
        ["attn-gate baseline show --device cpu", "attn-gate baseline show --file baselines/h200/sdpa-flash-pr.json"],
        ["0  shown", EXIT_2],
    ),
    "sweep": (
        "Correctness of one kernel over one suite, without a baseline: each case's error against a float64 "
        "reference, divided by its bound (pass <= 1).",
        [
            "attn-gate sweep --kernel sdpa-cpu --suite smoke --device cpu",
            "attn-gate sweep --kernel mypkg.attn:flash_fwd --suite pr --only 'bf16-.*causal'",
        ],
        ["0  every case within its bounds", "1  a case fails or raises", EXIT_2],
    ),
    "perf": (
        "Speed ratios (kernel time / anchor time, forward and backward) over a suite's timing cases, with "
        "their noise. No baseline, no verdict: `check` gates speed.",
        [
            "attn-gate perf --kernel sdpa-flash --suite pr --rounds 30",
            "attn-gate perf --kernel sdpa-cpu --suite smoke --device cpu --anchor matmul",
        ],
        ["0  measured", "1  a case raised", EXIT_2],
    ),
    "bench": (
        "Record this commit's timings in the asv history (asv run); history only, the verdict is `check`.",
        ["attn-gate bench --quick --device cpu", "attn-gate bench --kernel sdpa-flash --suite pr"],
        ["0  recorded", "1  asv failed or saved nothing", EXIT_2],
    ),
    "publish": (
        "Render the asv history as a static site that works offline (its scripts are shipped with it).",
        ["attn-gate publish && python -m http.server -d .asv/html"],
        ["0  published", "1  asv publish failed", EXIT_2],
    ),
    "drift": (
        "Train a toy transformer with the kernel and with reference attention; pass when the kernel's loss "
        "curve stays inside the band the reference runs span.",
        ["attn-gate drift --device cpu --steps 100", "attn-gate drift --kernel sdpa-flash --dtype bf16"],
        ["0  inside the band", "1  left the band, raised, or the loss went NaN", EXIT_2],
    ),
    "probe": (
        "Find a kernel's envelope: call it on tiny inputs along each axis (dtypes, head dims, GQA, lengths, "
        "masks, bias kinds, varlen, KV cache, layouts), each call in a worker with a timeout. A raise, crash or "
        "hang is unsupported and goes into the declaration; a wrong answer is printed as a finding and stays in "
        "the envelope (the gate judges it). Prints [tool.attn-gate.kernels.NAME.supports]; --write saves it.",
        [
            "attn-gate probe mypkg.attn:attn_func --device cpu",
            "attn-gate probe mykernel --write          # a family of pyproject.toml",
        ],
        ["0  probed (findings are printed, not failed)", EXIT_2],
    ),
    "kernels": (
        "Every built-in kernel, whether it runs on this machine, and what it supports.",
        ["attn-gate kernels"],
        ["0"],
    ),
    "suites": (
        "The suites (built in and from [tool.attn-gate.suites]) and their case counts; --cases lists every case "
        "id with a legend of the id grammar.",
        ["attn-gate suites", "attn-gate suites --cases"],
        ["0", EXIT_2],
    ),
    "bisect": (
        "Name the first commit between --good and --bad where the gate fails the given cases: git bisect over "
        "the range, each step a fresh worktree of the commit, its install step ([tool.attn-gate.ci] setup or "
        "--setup), then `attn-gate check` of exactly those cases against the config and baseline committed at "
        "--bad, re-run to catch a flaky verdict. A commit that does not install or load is skipped; a flaky "
        "case stops the bisect and is named.",
        [
            "attn-gate bisect --good v1.2 --last-failed            # the cases the last `check` in out/ failed",
            "attn-gate bisect --good 3f2a1c0 --bad main --only 'bf16-.*causal' --setup 'pip install -e .'",
            "attn-gate bisect --good v1.2 --last-failed --perf     # a speed regression, the confirm re-run deciding",
        ],
        [
            "0  the first bad commit is named (with its failing cases and tensors)",
            "1  no commit could be named: a case is flaky, or only commits that do not install were left",
            "2  usage error, or --bad passes / --good fails under the baseline (nothing to bisect)",
        ],
    ),
    "init": (
        "Set up a kernel repository for the gate: append [tool.attn-gate] to pyproject.toml and write the "
        "workflows, CODEOWNERS, the runner guard (.github/attn-gate-runner/), asv.conf.json and benchmarks/ "
        "from the templates of this attn-gate version, and out/ into .gitignore. The jobs install attn-gate the way "
        "it was installed here (a git commit, a wheel URL, an index version; a local source needs --install). "
        "Checks everything, then writes only what is absent (--force replaces; never through a link), prints "
        "what it did, the TODOs and the admin checklist; --check compares the files with the templates.",
        [
            "attn-gate init --kernel mypkg.attn:attn_func --gpu-class h100 --yes",
            "attn-gate init --kernel mypkg.attn:attn_func --repository me/kern --install 'attn-gate @ git+URL@COMMIT'",
            "attn-gate init --dense mypkg.attn:attn_func --varlen mypkg.attn:attn_varlen_func --yes",
            "attn-gate init --check                 # after upgrading attn-gate: what changed?",
        ],
        [
            "0  written (or nothing to do); --check: the files equal the templates",
            "1  --check: a file drifted from the templates (a diff per file), a placeholder, or an install "
            "line that cannot give this attn-gate",
            EXIT_2,
        ],
    ),
    "docs": (
        "Print a page of the documentation shipped with this attn-gate (the pages `init`, the workflows' "
        "messages and the admin checklist name), or list the pages.",
        [
            "attn-gate docs                        # the pages",
            "attn-gate docs ci                     # the CI set-up",
            "attn-gate docs adopt --path           # where the file is",
        ],
        ["0  printed", EXIT_2],
    ),
}


def parser_kwargs(name: str) -> dict:
    """description, epilog (examples and exit codes) and a formatter that keeps their lines."""
    description, examples, codes = HELP[name]
    epilog = (
        "examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\nexit codes:\n" + "\n".join(f"  {c}" for c in codes)
    )
    return {"description": description, "epilog": epilog, "formatter_class": argparse.RawDescriptionHelpFormatter}


CASE_ID_LEGEND = """\
case id legend (e.g. bf16-b2-h16/4-s97x257-d192/128-causal-win32.0-cap20-alibi-varlen1.97.0.130):
  bf16 | fp16 | fp32     the input dtype
  e4m3 | e5m2            fp8 inputs (float8_e4m3fn / float8_e5m2) with descale factors per (batch, KV
                         head), FA3's q/k/v_descale; forward-only, out in bf16
  b2                     batch 2
  h16  | h16/4           16 query heads; /4: 4 key/value heads (grouped-query attention; /1 is multi-query)
  s128 | s97x257         sequence length; 97x257: 97 queries, 257 keys
  d64  | d192/128        head dim; /128: a different head dim for V (and the output)
  causal                 causal mask, aligned bottom-right as flash-attn does
  win32.0                sliding window: 32 keys to the left, 0 to the right
  cap20                  softcap 20 (scores pass through 20 * tanh(s / 20))
  alibi                  ALiBi position bias
  drop0.1                dropout probability 0.1
  varlen1.97.0.130       variable length: 4 sequences of lengths 1, 97, 0 and 130 packed into one batch
  varlen5.40x50.3        ...x50.3: the keys' lengths per sequence differ from the queries' (cu_seqlens_k)
  kv | kv17.80           decode against a KV cache (flash_attn_with_kvcache): seqlens are query tokens x cache
                         capacity; .17.80: tokens already cached per batch element (none given: a full cache)
  append                 the decode call appends its new k/v tokens into the cache, then attends to them
  page16                 a paged cache of 16-token pages with a block table
  shuffled               the block table maps pages to physical blocks in a shuffled order
  sinks                  a learnable per-head sink logit in every softmax denominator
  nanleft                the cached tokens 256+ keys before the window hold NaN (never read by a kernel
                         that skips what its window excludes; 0 x NaN is NaN for one that reads them)
  splits3                knobs: a forced split-KV decode, the keys in 3 parts combined by their LSE
  packgqa | nopackgqa    knobs: pack_gqa forced on / off (a KV head's query heads packed into one tile's rows)
  hnd                    knobs: the cache handed heads-first, (batch or pages, heads, slots, dim)
  k_sliced | qkv_packed | bhsd_view | dout_noncontig | kv_stride0 | far_rows | far_batch
                         what the kernel is handed: K a strided slice; q, k, v head-slices of one QKV
                         buffer; (B, H, N, D) memory viewed as (B, N, H, D); a non-contiguous dO; K and V
                         expanded views (stride 0 over batch and KV heads); q, k, v and dO rows strided
                         so the last quarter start past 2^31 elements (int32 offsets wrap); batch
                         elements strided so the last starts past 2^31 elements (rows dense)
  large | shifted | outliers
                         how values are drawn: scores past +-88 (or deep into the softcap); every row's
                         LSE far below -88; two channels of K and V 30x larger
  bias.dense | bias.broadcast_b | bias.broadcast_h | bias.broadcast_1 | bias.shifted_rows | bias.growing
  bias.sunk_rows | bias.first_key
                         a float bias added to the scores: (B,H,Nq,Nk), shared over batch / heads / both,
                         rows shifted below -88, rising by 128 along the keys, rows whose every logit is
                         below -5e4, +1e4 on the first key; .fp32: a float32 bias with bf16/fp16 inputs;
                         .grad: dBias judged
  bias.bool_mask | bias.bool_empty_rows | bias.document | bias.prefix_lm
                         a boolean mask: random sparse, with fully masked rows, block-diagonal documents, prefix-LM
  [perf]                 also timed by `perf` / `check` (speed); [perf only]: timed, never swept"""
