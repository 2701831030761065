"""Kernel names -> adapters. A name with a colon is a user callable (`package.module:function`)."""

from __future__ import annotations

from gate.core.errors import UserError
from gate.kernels.base import KernelAdapter
from gate.kernels.flash_attn import FA2Adapter, FA3Adapter, FA4Adapter, FA4RawWindowAdapter
from gate.kernels.flex import FlexAdapter, FlexAdjustedMaskAdapter, FlexDynamicAdapter, FlexPackedAdapter
from gate.kernels.sdpa import BACKENDS, SdpaAdapter
from gate.kernels.tiled import TiledAdapter
from gate.kernels.user import UserAdapter, family_adapter_of


def _builtins() -> dict:
    table = {f"sdpa-{b}": (lambda b=b: SdpaAdapter(b)) for b in BACKENDS}
    # GQA/MQA by copied K/V heads (repeat_interleave), beside the enable_gqa=True path above
    table.update({f"sdpa-{b}-copyheads": (lambda b=b: SdpaAdapter(b, copy_heads=True)) for b in BACKENDS})
    table.update({"flex": FlexAdapter, "fa2": FA2Adapter, "fa3": FA3Adapter, "fa4": FA4Adapter, "tiled": TiledAdapter})
    table["fa4-raw-window"] = FA4RawWindowAdapter  # the (-1, 0) spelling reaching FA4
    table.update(
        {
            "flex-dynamic": FlexDynamicAdapter,
            "flex-adjusted-mask": FlexAdjustedMaskAdapter,
            "flex-packed": FlexPackedAdapter,
        }
    )
    return table


def kernel_names() -> list[str]:
    return sorted(_builtins())


def kernel_family(name: str, config):
    """The kernel family `[tool.attn-gate.kernels.NAME]` of `config` (a KernelFamily) that
    `name` names, or None; nothing of it is imported here (the isolated path sends it to a worker).
    A family may not take a built-in kernel's name: `--kernel NAME` must mean one thing."""
    families = getattr(config, "kernels", None) or {}
    if name not in families:
        return None
    if name in _builtins():
        raise UserError(
            f"{config.source} [tool.attn-gate.kernels.{name}]: {name!r} is a built-in kernel's name; rename the table"
        )
    return families[name]


def family_adapter(name: str, config) -> KernelAdapter | None:
    """The adapter of kernel family `name` (kernel_family), its entry points imported; None when not one."""
    family = kernel_family(name, config)
    if family is None:
        return None

    return family_adapter_of(family)


def resolve_kernel(name: str, config=None) -> KernelAdapter:
    """The adapter `name` stands for: a kernel family of `config`, else a built-in or a
    `package.module:function`. The one place a kernel name becomes an adapter."""
    return (family_adapter(name, config) if config is not None else None) or get_adapter(name)


def get_adapter(name: str) -> KernelAdapter:
    if ":" in name:
        return UserAdapter(name)
    table = _builtins()
    if name not in table:
        raise UserError(
            f"--kernel {name!r} is not a known kernel; choose one of {', '.join(sorted(table))} "
            f"or name your own function as 'package.module:function'"
        )
    return table[name]()
