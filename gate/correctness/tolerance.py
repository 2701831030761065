"""The tolerance rule, as plain arithmetic (no torch): what "within error" means.

For a tensor T of the kernel K, with G the float64 reference and P the same math in the input
dtype, all from the same rounded inputs:
    bound = mult * max|P - G| + floor        floor = 2 * rounding of the dtype near 0.3 (never 0)
    ratio = max|K - G| / bound               pass when ratio <= 1; headroom = 1 - ratio
A kernel may be as wrong as `mult` times what PyTorch's own low-precision arithmetic loses, plus
rounding. A fixed atol/rtol band fails correct kernels (every bf16 causal row, measured on an
H200); this rule does not, and still catches a 2% error in dK.

Its companion judges the mean over the same elements, as flash-attention's tests do, so that a
bias spread over every element (each one under the max bound) still fails:
    mean_bound = mean_mult * mean|P - G| + mean_floor    mean_floor = rounding floor / 8 + extra
    mean_ratio = mean|K - G| / mean_bound                 pass when mean_ratio <= 1
"""

from __future__ import annotations

from dataclasses import dataclass

# The seed lecture's per-dtype bands (atol, rtol): reported as information, never the verdict.
BANDS = {"fp32": (1e-5, 1e-4), "bf16": (5e-3, 5e-3), "fp16": (1e-3, 1e-3)}

# Machine epsilon per dtype; the spacing of numbers near 0.3 is eps / 4 (0.3 lies in [0.25, 0.5)).
EPS = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10}


# the LSE floor's allowance for approximate exp/log (kernels use fast transcendental
# functions: torch's CPU flash kernel's vectorised exp, ex2.approx/lg2.approx on NVIDIA GPUs). An
# error in the row sum l of relative size e moves LSE = m + log(l) by e, whatever |LSE| is, so
# this is absolute. Measured on CPU: torch's CPU kernel errs 2.4-3.0e-5 in bf16/fp16 (d 40-128;
# up to 6e-5 on causal rows), tiled and the float32 reference ~5e-7. 2**-12 = 2.4e-4 keeps those
# at ratio <= ~0.25, and an LSE off by 1e-3 fails at ratio ~4 (tests/test_coverage_axes.py).
LSE_APPROX_FLOOR = 2.0**-12


def rounding_floor(measured: float, dtype: str) -> float:
    """2 * rounding measured near 0.3, but never below one spacing there (never 0)."""
    return max(measured, EPS[dtype] / 4)


def error_bound(pt_err: float, floor: float, mult: float) -> float:
    return mult * pt_err + floor


# The mean's floor, where P is exact (mean|P - G| ~ 0: fp32, outputs that copy V). The rounding
# floor is one spacing s where the largest values sit; a rounding error spread evenly over +-s/2
# averages s/4, and the typical value sits lower than the largest: an eighth. Measured on CPU
# (smoke, sdpa-cpu and tiled, every tensor): correct kernels' worst mean ratio 0.95 (sdpa-cpu's
# fp16 dV with one key: its mean error is 1.48x P's); at s/4 a bias of half an ulp on out passes
# every multi-key case, at s/8 it fails on the large-output ones (mean ratio 1.01-1.09).
MEAN_FLOOR_SHARE = 0.125


def mean_floor(rounding: float, extra: float = 0.0) -> float:
    """The mean's floor: its share of the rounding floor, plus the spec's whole absolute allowance
    (approximate exp/log errs in the same direction on every element, so a mean does not shrink it)."""
    return MEAN_FLOOR_SHARE * rounding + extra


@dataclass(frozen=True)
class TensorSpec:
    """How one kind of tensor is compared with its reference, as data (torch.testing's Pair
    classes): the comparison code reads these fields and never asks which tensor it holds."""

    name: str
    # the leaf input this is the gradient of (its shape is the gradient's); "" for a forward tensor
    grad_of: str = ""
    # compare only where the reference is finite: a fully masked row's LSE is a convention
    # (-inf here, +inf in flash-attn), not a value
    finite_only: bool = False
    # where the worst element is: a flat index into the compared elements (they are a selection)
    flat_index: bool = False
    # the dtype of the yardstick P and of the rounding floor; None: the input dtype. The LSE is
    # float32 in every kernel, accumulated from the rounded inputs' scores in float32: its
    # yardstick in bf16 made the bound ~0.06 nats and let a 1e-3 bias pass
    yardstick_dtype: str | None = None
    floor_extra: float = 0.0  # added to the rounding floor (approximate exp/log for the LSE)
    # within a packed (total, ...) varlen tensor, the dimension that runs over tokens
    packed_token_dim: int = 0
    missing: str = ""  # why a gradient can be missing, said when it is
    exact: bool = False  # judged bit-exact against the expected value (a copy: the cache after a decode call)

    def __post_init__(self):
        # a selection of elements has no shape to index: its worst element is a flat index
        if self.finite_only and not self.flat_index:
            raise ValueError(f"tensor spec {self.name!r}: finite_only needs flat_index")


SPECS: dict[str, TensorSpec] = {
    s.name: s
    for s in (
        TensorSpec("out"),
        TensorSpec(
            "lse",
            finite_only=True,
            flat_index=True,
            yardstick_dtype="fp32",
            floor_extra=LSE_APPROX_FLOOR,
            packed_token_dim=1,
        ),
        TensorSpec("dq", grad_of="q", missing="out does not depend on q"),
        TensorSpec("dk", grad_of="k", missing="out does not depend on k"),
        TensorSpec("dv", grad_of="v", missing="out does not depend on v"),
        TensorSpec("dbias", grad_of="bias", missing="the bias got no gradient (detached, or not part of the graph)"),
        TensorSpec("dsink", grad_of="sink", missing="the sink logits got no gradient"),
        TensorSpec("k_cache", exact=True),
        TensorSpec("v_cache", exact=True),
    )
}


def tensor_spec(name: str) -> TensorSpec:
    """The comparison spec of a tensor kind; an unknown name is a programming error (KeyError)."""
    return SPECS[name]
