"""Compile FA4's SM90 forward and backward with attn-gate's bias / mask mods, on a machine WITHOUT a GPU.

Prints one line per configuration (no report: it is the CPU half of the FA4 bias evidence; the
GPU half, what the kernels compute, is evidence/h200/fa4_bias_probe.py).

    FLASH_ATTENTION_ARCH=sm_90 CUTE_DSL_ARCH=sm_90a FLASH_ATTENTION_NUM_SMS=132 \\
        PYTHONPATH=. python3 evidence/fa4_mods_compile.py

Needs flash-attn-4 (4.0.0b36 is what the H200 runs), nvidia-cutlass-dsl, and quack's imports
(triton, sympy); not torch.cuda. FA4 supports CPU-only compilation: under torch's FakeTensorMode
its `_flash_attn_fwd` / `_flash_attn_bwd` build and `cute.compile` the kernels for the arch named
by the variables above and skip the launch (interface.py, `fake_mode`). So this checks that
gate/kernels/fa4_mods.py traces inside FA4's real kernels (signatures, keyword names, aux-tensor
indexing, the dtype conversions) for each aux dtype and broadcast pattern the adapter hands over;
it says nothing about the numbers the kernels produce.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gate.kernels import fa4_mods

# (label, input dtype, Nq, Nk, Hq, Hk, d, causal, window, aux: ("bias", dtype) or ("mask",), one_batch, one_head)
CONFIGS = [
    ("dense bf16 bias", torch.bfloat16, 1088, 1088, 8, 8, 128, False, (None, None), ("bias", torch.bfloat16), False, False),
    ("broadcast_h bf16, causal, 257x704", torch.bfloat16, 257, 704, 8, 8, 128, True, (None, None), ("bias", torch.bfloat16), False, True),
    ("broadcast_b bf16, causal", torch.bfloat16, 1088, 1088, 8, 8, 128, True, (None, None), ("bias", torch.bfloat16), True, False),
    ("broadcast_1 fp32 bias, causal", torch.bfloat16, 1088, 1088, 8, 8, 128, True, (None, None), ("bias", torch.float32), True, True),
    ("fp16 inputs, fp32 bias", torch.float16, 1088, 1088, 8, 8, 128, False, (None, None), ("bias", torch.float32), False, False),
    ("fp16 inputs, fp16 bias", torch.float16, 1088, 1088, 8, 8, 128, False, (None, None), ("bias", torch.float16), False, False),
    ("GQA 8/2 d64, window (256, 0), bf16 bias", torch.bfloat16, 1024, 1024, 8, 2, 64, False, (256, 0), ("bias", torch.bfloat16), False, False),
    ("bool mask (uint8), dense", torch.bfloat16, 1088, 1088, 8, 8, 128, False, (None, None), ("mask",), False, False),
    ("document mask (uint8), broadcast_h, 257x704", torch.bfloat16, 257, 704, 8, 8, 128, False, (None, None), ("mask",), False, True),
    ("GQA 8/2 d64 mask, broadcast_h", torch.bfloat16, 1024, 1024, 8, 2, 64, False, (None, None), ("mask",), False, True),
]


def compile_one(dtype, nq, nk, hq, hk, d, causal, window, aux, one_batch, one_head) -> tuple[float, float]:
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    b = 2
    with FakeTensorMode():
        q = torch.empty(b, nq, hq, d, dtype=dtype, device="cuda")
        k = torch.empty(b, nk, hk, d, dtype=dtype, device="cuda")
        v = torch.empty(b, nk, hk, d, dtype=dtype, device="cuda")
        shape = (1 if one_batch else b, 1 if one_head else hq, nq, nk)
        if aux[0] == "bias":
            fwd = dict(score_mod=fa4_mods.bias_score_mod(one_batch, one_head),
                       aux_tensors=[torch.empty(shape, dtype=aux[1], device="cuda")])
            bwd = dict(fwd, score_mod_bwd=fa4_mods.bias_score_mod_bwd)
        else:  # what the adapter does under a mask_mod: causal/window folded into the mask, passed as off
            causal, window = False, (None, None)
            fwd = dict(mask_mod=fa4_mods.bool_mask_mod(one_batch, one_head),
                       aux_tensors=[torch.empty(shape, dtype=torch.uint8, device="cuda")])
            bwd = fwd
        t0 = time.perf_counter()
        out, lse, *_ = _flash_attn_fwd(q, k, v, softmax_scale=d ** -0.5, causal=causal, window_size_left=window[0],
                                       window_size_right=window[1], return_lse=True, **fwd)
        t1 = time.perf_counter()
        _flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, d ** -0.5, causal, 0.0,
                        window_size_left=window[0], window_size_right=window[1], **bwd)
        return t1 - t0, time.perf_counter() - t1


def main() -> int:
    missing = [v for v in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS") if v not in os.environ]
    if missing and not torch.cuda.is_available():
        print(f"set {', '.join(missing)} (see the docstring): without a GPU FA4 needs them to pick and compile the SM90 path")
        return 2
    failed = 0
    for label, *config in CONFIGS:
        try:
            f, b = compile_one(*config)
            print(f"ok    {label:45} forward {f:5.1f} s, backward {b:5.1f} s", flush=True)
        except Exception as exc:
            failed += 1
            print(f"FAIL  {label:45} {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
            traceback.print_exc(limit=-3)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
