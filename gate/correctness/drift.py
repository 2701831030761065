"""Training drift: does a kernel that passes every single-step check still train like the reference?

Errors that are harmless once can add up over a training run (a biased rounding, a gradient term
slightly off, a mask that is right at step 0 and wrong for the shapes the model moves to). So:
a one-layer toy transformer (embedding + learned positions, one causal attention block, MLP,
LM head) learns a copy task (the second half of each sequence repeats the first: only attention
can solve it). It is trained N steps from the same initialisation on the same batches:

  * with the kernel under test (q, k, v rounded to the kernel dtype, its output back to float32);
  * with float32 reference attention (plain softmax, autograd): the reference curve;
  * with reference variants that differ ONLY in reduction order or precision: float64
    attention; the kernel dtype's rounding of q, k, v and the output; the keys summed in reverse
    order. Their spread is what an honest kernel may differ by.

Band (per step, on curves smoothed by a trailing moving average):
    lo, hi = min, max over the reference variants
    margin = widen * (hi - lo) + rel_floor * |reference|
    pass when every step of the kernel's curve lies in [lo - margin, hi + margin]
A NaN loss or a kernel that raises fails. The decision (`band`, `judge`) is plain arithmetic
over lists; torch is imported only to train.

JSON format history (DriftResult): 1 first version.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gate.core.errors import UserError, first_line
from gate.core.files import safe_name
from gate.core.jsonio import save_figure_atomic, write_json_atomic

SCHEMA_VERSION = 1
REFERENCE = "reference fp32"
VARIANTS = ("reference fp64", "reference {dtype} I/O", "reference fp32 reversed keys")


@dataclass(frozen=True)
class DriftConfig:
    """The toy model and its training; `default_config` picks GPU or CPU sizes."""

    steps: int
    batch: int
    seqlen: int
    d_model: int
    heads: int
    vocab: int = 16
    lr: float = 1e-2
    dtype: str = "bf16"
    seed: int = 0
    smooth: int = 0  # moving-average window; 0 = steps // 50 (at least 1)
    widen: float = 1.0
    rel_floor: float = 0.01

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise UserError(f"--steps {self.steps}: drift needs at least 2 training steps")
        if self.seqlen % 2 or self.seqlen < 4:
            raise UserError(f"seqlen {self.seqlen}: the copy task needs an even length >= 4")
        if self.d_model % self.heads:
            raise UserError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise UserError(f"--dtype {self.dtype!r}: choose bf16, fp16 or fp32")

    @property
    def window(self) -> int:
        return self.smooth or max(1, self.steps // 50)


def default_config(device: str, steps: int | None = None, dtype: str = "bf16", seed: int = 0) -> DriftConfig:
    """GPU: 1000 steps, d_model 128 (head_dim 64), 32 sequences of 128 tokens over 16 symbols.
    CPU: 100 steps of a tiny model (d_model 32, 8 sequences of 16 tokens over 8 symbols), which
    learns the copy between steps 50 and 80 (measured), so the curve has a slope to drift from."""
    if device == "cuda":
        return DriftConfig(
            steps=steps or 1000, batch=32, seqlen=128, d_model=128, heads=2, vocab=16, lr=3e-3, dtype=dtype, seed=seed
        )
    return DriftConfig(
        steps=steps or 100, batch=8, seqlen=16, d_model=32, heads=2, vocab=8, lr=1e-2, dtype=dtype, seed=seed
    )


# ---------------------------------------------------------------- decision (plain arithmetic)


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start); NaN stays NaN."""
    out = []
    for i in range(len(values)):
        recent = values[max(0, i - window + 1) : i + 1]
        out.append(sum(recent) / len(recent))  # NaN in the window gives NaN
    return out


def band(
    references: list[list[float]], center: list[float], widen: float, rel_floor: float
) -> tuple[list[float], list[float]]:
    """Per-step (lower, upper) from the smoothed reference curves (see the module doc)."""
    lower, upper = [], []
    for t, c in enumerate(center):
        vals = [r[t] for r in references]
        lo, hi = min(vals), max(vals)
        margin = widen * (hi - lo) + rel_floor * abs(c)
        lower.append(lo - margin)
        upper.append(hi + margin)
    return lower, upper


@dataclass(frozen=True)
class Judgement:
    passed: bool
    steps_outside: int
    worst_step: int  # -1 when none outside
    worst_excess: float  # how far outside the band, in loss units (0 when inside)
    reason: str


def judge(kernel: list[float], lower: list[float], upper: list[float]) -> Judgement:
    """Pass when every step is inside [lower, upper]; a NaN/inf in the kernel's curve or in the
    band (a diverged reference leaves nothing to compare with) is outside: fail closed."""
    outside, worst, worst_t = 0, 0.0, -1
    for t, (k, lo, hi) in enumerate(zip(kernel, lower, upper)):
        finite = math.isfinite(k) and math.isfinite(lo) and math.isfinite(hi)
        excess = math.inf if not finite else max(lo - k, k - hi, 0.0)
        if excess > 0:
            outside += 1
            if excess > worst or worst_t < 0:
                worst, worst_t = excess, t
    if len(kernel) != len(lower):
        return Judgement(False, outside, worst_t, worst, f"kernel curve has {len(kernel)} steps, band {len(lower)}")
    if outside:
        return Judgement(
            False,
            outside,
            worst_t,
            worst,
            f"{outside}/{len(kernel)} steps outside the band; worst at step {worst_t + 1}, {worst:.3g} beyond it",
        )
    return Judgement(True, 0, -1, 0.0, f"all {len(kernel)} steps inside the band")


@dataclass(frozen=True)
class DriftResult:
    kernel: str
    device: str
    config: dict[str, Any]
    environment: dict[str, Any]
    curves: dict[str, list[float]]  # raw per-step losses: the kernel's and every reference run's
    smoothed: dict[str, list[float]]
    lower: list[float]
    upper: list[float]
    passed: bool
    reason: str
    steps_outside: int
    worst_step: int
    worst_excess: float
    wall_s: float
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = "attn-gate drift"
        data["notes"] = list(self.notes)
        data["wall_s"] = round(self.wall_s, 2)
        return data

    def write(self, path: Path) -> None:
        write_json_atomic(path, self.to_dict())


# ---------------------------------------------------------------- training (torch)


def _copy_batch(cfg: DriftConfig, step: int, device):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(cfg.seed * 1_000_003 + step)
    half = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seqlen // 2), generator=gen)
    return torch.cat([half, half], dim=1).to(device)


def reference_attention(q, k, v, scale: float, compute_dtype=None, reverse_keys: bool = False):
    """Causal softmax attention by autograd on (B, N, H, D), in `compute_dtype` (default q's)."""
    import torch

    dt = compute_dtype or q.dtype
    qh, kh, vh = (t.to(dt).transpose(1, 2) for t in (q, k, v))
    n = qh.shape[2]
    allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    if reverse_keys:  # the same sums, in the opposite order
        kh, vh, allowed = kh.flip(2), vh.flip(2), allowed.flip(1)
    s = (qh @ kh.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
    return (p @ vh).transpose(1, 2).to(q.dtype)


def kernel_attention(adapter, dtype) -> Callable:
    """Attention through a kernel adapter: q, k, v rounded to `dtype`, the output back to float32."""
    from gate.attention.reference import AttnOptions
    from gate.kernels.base import KernelCall

    def attend(q, k, v, scale):
        opts = AttnOptions(softmax_scale=scale, causal=True)
        out = adapter(KernelCall(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), opts=opts)).out
        return out.to(q.dtype)

    return attend


def _variants(cfg: DriftConfig) -> dict[str, Callable]:
    import torch

    from gate.attention.inputs import TORCH_DTYPES

    low = TORCH_DTYPES[cfg.dtype]
    return {
        REFERENCE: lambda q, k, v, s: reference_attention(q, k, v, s),
        VARIANTS[0]: lambda q, k, v, s: reference_attention(q, k, v, s, torch.float64),
        VARIANTS[1].format(dtype=cfg.dtype): lambda q, k, v, s: (
            reference_attention(q.to(low).float(), k.to(low).float(), v.to(low).float(), s).to(low).float()
        ),
        VARIANTS[2]: lambda q, k, v, s: reference_attention(q, k, v, s, reverse_keys=True),
    }


def _build_model(cfg: DriftConfig, device):
    import torch
    from torch import nn

    class ToyTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.d_model
            self.emb = nn.Embedding(cfg.vocab, d)
            self.pos = nn.Parameter(torch.randn(cfg.seqlen, d) * 0.5)
            self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.head = nn.Linear(d, cfg.vocab)

        def forward(self, tokens, attend):
            b, n = tokens.shape
            x = self.emb(tokens) + self.pos[:n]
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, cfg.heads, cfg.d_model // cfg.heads).unbind(dim=2)
            x = x + self.proj(attend(q, k, v, (cfg.d_model // cfg.heads) ** -0.5).reshape(b, n, cfg.d_model))
            x = x + self.mlp(self.ln2(x))
            return self.head(self.ln3(x))

    torch.manual_seed(cfg.seed)
    return ToyTransformer().to(device)


def train_curve(cfg: DriftConfig, attend: Callable, init_state: dict, device) -> list[float]:
    """Per-step training losses (next-token cross-entropy) of one run from `init_state`."""
    import torch

    model = _build_model(cfg, device)
    model.load_state_dict(init_state)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        tokens = _copy_batch(cfg, step, device)
        logits = model(tokens[:, :-1], attend)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.detach())
        losses.append(value)
        if not math.isfinite(value):
            losses += [math.nan] * (cfg.steps - step - 1)
            break
    return losses


def initial_state(cfg: DriftConfig, device) -> dict:
    return copy.deepcopy(_build_model(cfg, device).state_dict())


def reference_curves(
    cfg: DriftConfig, device: str, progress: Callable[[str], None] | None = None
) -> dict[str, list[float]]:
    """The reference runs' raw losses: the float32 reference and its reduction-order/precision variants."""
    say = progress or (lambda _msg: None)
    init = initial_state(cfg, device)
    curves = {}
    for name, attend in _variants(cfg).items():
        say(f"training {name} ({cfg.steps} steps)")
        curves[name] = train_curve(cfg, attend, init, device)
    return curves


def run_drift(
    kernel: str,
    cfg: DriftConfig,
    device: str,
    adapter=None,
    progress: Callable[[str], None] | None = None,
    references: dict[str, list[float]] | None = None,
) -> DriftResult:
    """Train the reference runs (or reuse `references` from reference_curves with the same cfg)
    and the kernel's run; decide against the band."""
    from gate.attention.inputs import TORCH_DTYPES
    from gate.core.environment import describe
    from gate.kernels.registry import get_adapter

    t0 = time.perf_counter()
    adapter = adapter or get_adapter(kernel)
    missing = adapter.unavailable_reason()
    if missing:
        raise UserError(f"--kernel {kernel!r} is unavailable here: {missing}")
    caps = adapter.capabilities()
    if device not in caps.devices:
        raise UserError(f"--kernel {kernel!r} runs on {'/'.join(caps.devices)}, not {device}; pass --device")
    if cfg.dtype not in caps.dtypes:
        raise UserError(f"--dtype {cfg.dtype}: kernel {kernel!r} supports {', '.join(caps.dtypes)}")
    say = progress or (lambda _msg: None)
    if references is not None and (
        set(references) != set(_variants(cfg)) or any(len(c) != cfg.steps for c in references.values())
    ):
        raise ValueError("references do not match this drift configuration")
    curves = dict(references) if references is not None else reference_curves(cfg, device, progress)
    init = initial_state(cfg, device)
    say(f"training kernel {kernel} ({cfg.steps} steps)")
    notes: list[str] = []
    try:
        curves[f"kernel {kernel}"] = train_curve(cfg, kernel_attention(adapter, TORCH_DTYPES[cfg.dtype]), init, device)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a crashing kernel (sys.exit too) is a failed run, reported, not a traceback
        notes.append(f"the kernel raised {first_line(exc)}")
        curves[f"kernel {kernel}"] = [math.nan] * cfg.steps
    smoothed = {name: moving_average(c, cfg.window) for name, c in curves.items()}
    refs = [smoothed[name] for name in curves if not name.startswith("kernel ")]
    lower, upper = band(refs, smoothed[REFERENCE], cfg.widen, cfg.rel_floor)
    verdict = judge(smoothed[f"kernel {kernel}"], lower, upper)
    reason = verdict.reason if not notes else f"{notes[0]}; {verdict.reason}"
    return DriftResult(
        kernel=kernel,
        device=device,
        config=dataclasses.asdict(cfg),
        environment=describe(device, kernel, adapter.version()),
        curves=curves,
        smoothed=smoothed,
        lower=lower,
        upper=upper,
        passed=verdict.passed,
        reason=reason,
        steps_outside=verdict.steps_outside,
        worst_step=verdict.worst_step,
        worst_excess=verdict.worst_excess,
        wall_s=time.perf_counter() - t0,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------- rendering (reads the result)


def plot_drift(result: DriftResult, path: Path) -> Path:
    """Loss curves with the band (top) and each curve minus the float32 reference (bottom)."""

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(9, 7))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    steps = list(range(1, len(result.lower) + 1))
    ref = result.smoothed[REFERENCE]
    kernel_name = next(n for n in result.smoothed if n.startswith("kernel "))
    top.fill_between(steps, result.lower, result.upper, color="#9ecae1", alpha=0.6, label="band")
    bottom.fill_between(
        steps,
        [lo - r for lo, r in zip(result.lower, ref)],
        [hi - r for hi, r in zip(result.upper, ref)],
        color="#9ecae1",
        alpha=0.6,
        label="band",
    )
    for name, curve in result.smoothed.items():
        is_kernel = name == kernel_name
        style = dict(color="#d62728" if is_kernel else None, lw=1.8 if is_kernel else 0.9, label=name)
        top.plot(steps, curve, **style)
        bottom.plot(steps, [c - r for c, r in zip(curve, ref)], **style)
    verdict = "PASS" if result.passed else "FAIL"
    top.set_title(
        f"drift: {result.kernel} ({result.config['dtype']}, {result.device}) - {verdict}: {result.reason}", fontsize=9
    )
    top.set_ylabel(
        f"training loss (moving average of {result.config['smooth'] or max(1, result.config['steps'] // 50)})"
    )
    bottom.set_ylabel("minus the fp32 reference")
    bottom.set_xlabel("step")
    top.legend(fontsize=7)

    return save_figure_atomic(fig, path, dpi=110)


def write_drift_outputs(result: DriftResult, out_dir: Path) -> dict[str, Path]:
    stem = f"drift-{safe_name(result.kernel)}"
    paths = {"json": Path(out_dir) / f"{stem}.json", "png": Path(out_dir) / f"{stem}.png"}
    result.write(paths["json"])
    plot_drift(result, paths["png"])
    return paths
