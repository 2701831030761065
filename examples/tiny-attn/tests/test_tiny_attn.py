"""The kernel's own unit test (attn-gate is the regression gate on top of it): forward and
gradients equal PyTorch's attention in float64, dense and varlen."""

import torch
import torch.nn.functional as F
from tiny_attn import flash_attn_func, flash_attn_varlen_func


def reference(q, k, v, causal):
    group = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)


def test_dense_matches_sdpa_with_gradients():
    torch.manual_seed(0)
    q = torch.randn(2, 33, 4, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 33, 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 33, 2, 16, dtype=torch.float64, requires_grad=True)
    for causal in (False, True):
        got = flash_attn_func(q, k, v, causal=causal)
        want = reference(q, k, v, causal)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        g_got = torch.autograd.grad(got.sum(), (q, k, v))
        g_want = torch.autograd.grad(want.sum(), (q, k, v))
        for a, b in zip(g_got, g_want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_varlen_is_each_sequence_alone():
    torch.manual_seed(1)
    lens = [5, 0, 9]
    q, k, v = (torch.randn(sum(lens), 2, 8, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 5, 5, 14], dtype=torch.int32)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 14)
    torch.testing.assert_close(out[5:], flash_attn_func(q[None, 5:], k[None, 5:], v[None, 5:], causal=True)[0])
