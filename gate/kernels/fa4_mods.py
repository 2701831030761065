"""CuTe DSL mods that hand FA4 (`flash_attn.cute`) a case's custom bias or boolean mask.

Imported only by the fa4 adapter, and only for a bias case: it needs `cutlass` (nvidia-cutlass-dsl),
which comes with flash-attn-4 and is absent on CPU machines.

The signatures are FA4's (flash_attn/cute/softmax.py call_score_mod / call_score_mod_bwd and
mask.py call_mask_mod, 4.0.0b36; score mods are called with q_idx, kv_idx, seqlen_info and
aux_tensors as keywords, so those names are part of the contract):

    score_mod(score, batch_idx, head_idx, q_idx=, kv_idx=, seqlen_info=, aux_tensors=)
    score_mod_bwd(grad, score, batch_idx, head_idx, q_idx=, kv_idx=, seqlen_info=, aux_tensors=)
    mask_mod(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors)

Every index argument is a TensorSSA of one element: with aux_tensors FA4's SM90 kernels call the
mods one score at a time (flash_fwd.py score_vec_size, flash_bwd_sm90.py vec_size: 1 when
has_aux_tensors), and the forward SM90 mask path always does. `score` is the scaled score
(softmax_scale applied before the mod), float32; head_idx is the query head (FA4 unpacks
pack-GQA before calling); q_idx / kv_idx are the row and key within the sequence. FA4 wraps them
into range before a score_mod (softmax.py, "in order to not read OOB") and masks the out-of-range
entries itself; before a mask_mod its SM90 forward wraps them only on the key tile that masks the
sequence end (mask.py apply_mask, mask_seqlen), so on other key tiles the rows of a partial last
query tile arrive past the end (read in the 4.0.0b36 source; flash-attention PR #2091 fixed that for
SM100). The mods here read them as given, as a user's would. That is the fault at 65,537 keys with a
boolean mask, reproduced in plain FA4 on an H200 (docs/upstream-findings.md):
a mask_mod reading a (1, 1, S, S) mask faults at S = 46,341, 65,536 and 65,537, each with a partial
last query tile, runs right at S = 65,664 (no partial tile) and with its indices taken modulo S.

aux_tensors[0] is the bias (float: bf16, fp16 or fp32, read and widened to float32) or the mask
(uint8, nonzero = allowed), in the case's own 4-D shape (b, h, Nq, Nk) with b in {B, 1} and h in
{Hq, 1}: a broadcast dimension is read at index 0 (the index times 0), so nothing is expanded.
FA4 caches compiled kernels by utils.hash_callable (source and closure values): each mod is built
once per broadcast pattern here and reused, so a sweep compiles each (pattern, dtype, shape
family) once.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute


@functools.cache
def bias_score_mod(one_batch: bool, one_head: bool):
    """score + bias[b, h, q_idx, kv_idx] (b = 0 where the bias has one batch, h = 0 where one head)."""
    b_step = 0 if one_batch else 1
    h_step = 0 if one_head else 1

    @cute.jit
    def score_plus_bias(score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        bias = aux_tensors[0]
        value = cute.make_rmem_tensor(1, bias.element_type)
        value[0] = bias[batch_idx[0] * b_step, head_idx[0] * h_step, q_idx[0], kv_idx[0]]
        return score + value.load().to(cutlass.Float32)

    return score_plus_bias


@cute.jit
def bias_score_mod_bwd(grad, score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
    """d(score + bias)/d(score) = 1: the gradient passes through unchanged. (The gradient w.r.t. the
    bias itself is this same `grad`, but FA4's backward has no output for an aux tensor.)"""
    return grad


@functools.cache
def bool_mask_mod(one_batch: bool, one_head: bool):
    """True where mask[b, h, q_idx, kv_idx] != 0 (broadcast dimensions read at index 0)."""
    b_step = 0 if one_batch else 1
    h_step = 0 if one_head else 1

    @cute.jit
    def allowed_by_mask(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        mask = aux_tensors[0]
        allowed = cute.make_rmem_tensor(1, cutlass.Boolean)
        allowed[0] = cutlass.Int32(
            mask[batch_idx[0] * b_step, head_idx[0] * h_step, q_idx[0], kv_idx[0]]
        ) != cutlass.Int32(0)
        return allowed.load()

    return allowed_by_mask
