"""Kernel names -> adapters. A name with a colon is a user callable (`package.module:function`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.core.errors import UserError
from gate.kernels.base import KernelAdapter
from gate.kernels.flash_attn import FA2Adapter, FA3Adapter, FA4Adapter, FA4RawWindowAdapter
from gate.kernels.flex import (
    FlexAdapter,
    FlexAdjustedMaskAdapter,
    FlexBlockSizeAdapter,
    FlexDynamicAdapter,
    FlexPackedAdapter,
    FlexPagedAdapter,
    FlexSlicedMaskAdapter,
)
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
            "flex-paged": FlexPagedAdapter,
            "flex-sliced-mask": FlexSlicedMaskAdapter,
            # Flex's block masks with blocks other than 128: both sides 64, and 128 queries x 64 keys
            "flex-block64": lambda: FlexBlockSizeAdapter("flex-block64", (64, 64)),
            "flex-block128x64": lambda: FlexBlockSizeAdapter("flex-block128x64", (128, 64)),
        }
    )
    return table


def kernel_names() -> list[str]:
    return sorted(_builtins())


@dataclass(frozen=True)
class KernelEntry:
    """What a kernel name stands for: a kernel family `[tool.attn-gate.kernels.NAME]` of the config
    (nothing of it imported here: the isolated path sends it to a worker), else a built-in or a
    `package.module:function`. `adapter()` builds the adapter in this process."""

    name: str
    family: Any = None  # the config's KernelFamily `name` names, or None

    def adapter(self) -> KernelAdapter:
        """The name's adapter, built now."""
        if self.family is not None:
            return family_adapter_of(self.family)  # its entry points imported
        if ":" in self.name:
            return UserAdapter(self.name)
        table = _builtins()
        if self.name not in table:
            raise UserError(
                f"--kernel {self.name!r} is not a known kernel; choose one of {', '.join(sorted(table))} "
                f"or name your own function as 'package.module:function'"
            )
        return table[self.name]()


def kernel_entry(name: str, config=None) -> KernelEntry:
    """The one place a kernel name is resolved: a kernel family of `config`, else a built-in or a
    `package.module:function`. A family may not take a built-in kernel's name: `--kernel NAME`
    must mean one thing."""
    families = getattr(config, "kernels", None) or {}
    if name not in families:
        return KernelEntry(name)
    if name in _builtins():
        raise UserError(
            f"{config.source} [tool.attn-gate.kernels.{name}]: {name!r} is a built-in kernel's name; rename the table"
        )
    return KernelEntry(name, families[name])


def get_adapter(name: str) -> KernelAdapter:
    """A built-in's or a `package.module:function`'s adapter (no config: no kernel family)."""
    return kernel_entry(name).adapter()
