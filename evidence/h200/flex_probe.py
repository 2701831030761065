"""Probe: which FlexAttention layouts give right gradients at seqlen 97 (pr sweep: wrong dQ/dK/dV)?

Produces the FlexAttention seqlen-97 finding in reports/h200/README.md (printed ratios, no files).

    PYTHONPATH=. python3 evidence/h200/flex_probe.py

Runs the flex adapter through run_case on a few shapes, with the adapter's inputs as they are
(transposed views of (B, N, H, D)) and made contiguous in (B, H, N, D), and prints the ratios.
"""

import sys
import traceback


from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.correctness.run_case import run_case
from gate.kernels import flex as flexmod


def main() -> int:
    shapes = [
        Case(2, 97, 97, 16, 4, 64, 64, "bf16"), Case(2, 97, 97, 16, 16, 64, 64, "bf16"),
        Case(2, 96, 96, 16, 4, 64, 64, "bf16"), Case(2, 128, 128, 16, 4, 64, 64, "bf16"),
        Case(2, 97, 97, 16, 4, 64, 64, "bf16", causal=True), Case(2, 200, 200, 8, 8, 128, 128, "bf16", causal=True),
    ]
    original = flexmod.FlexAdapter._dense
    for contiguous in (False, True):
        if contiguous:
            def dense(self, q, k, v, call):
                return original(self, *(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)), call)
            flexmod.FlexAdapter._dense = dense
        adapter = flexmod.FlexAdapter()
        for case in shapes:
            try:
                r = run_case(adapter, case, "cuda", ToleranceConfig())
                ratios = " ".join(f"{t.tensor}:{t.ratio:.2f}" for t in r.tensors)
                print(f"contiguous={contiguous!s:5} {case.id:35} {r.status.value:5} {ratios} {r.reason[:160]}", flush=True)
            except Exception:
                traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
