"""Check a command's names and options before anything runs: kernel, suite, device, the
working directory. A typo must be answered as a typo ("did you mean sdpa-cpu?", exit 2), never
with advice that follows from it (a "no baseline, create one" for a kernel that does not exist,
a traceback for `--device cuda` on a CPU machine).

Every command calls `validate_target` first; `baseline_hint` checks the working directory when a
baseline is missing, so "no baseline" is only said where a baseline could exist.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.core.cases import suite_names
from gate.core.config import Config, IsolationConfig
from gate.core.errors import UserError
from gate.core.identity import Scope
from gate.workflow.isolation import worker_pool


@dataclass(frozen=True)
class ValidTarget:
    kernel: str
    suite: str
    device: str
    adapter: Any = None  # the adapter check_kernel built here; None where a worker checked the kernel
    entry: Any = None  # the kernel's registry entry (gate.kernels.registry.KernelEntry); None: not checked


def nearest(name: str, known: list[str] | tuple[str, ...], n: int = 3) -> str:
    """' (did you mean a or b?)' for the closest known names, or '' when none is close."""
    close = difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)
    if not close:
        close = [k for k in known if name and (name.lower() in k.lower() or k.lower() in name.lower())][:n]
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def check_device(device: str | None) -> str:
    """`--device cuda` without a visible GPU is a usage error of one line, not a traceback. torch
    is imported only to answer a question about the GPU (`--device cpu` needs none)."""
    if device not in (None, "cpu", "cuda"):
        raise UserError(f"--device {device!r}: choose cpu or cuda{nearest(str(device), ('cpu', 'cuda'))}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA GPU is visible here; leave --device out to use the CPU")
    if device is not None:
        return device
    from gate.core.environment import default_device

    return default_device()


def _check_kernel_in_worker(entry, device: str, option: str, config: Config | None) -> None:
    kernel, family = entry.name, entry.family
    if family is None:
        module, _, function = kernel.partition(":")
        if not module or not function:
            raise UserError(f"{option} {kernel!r}: a user kernel is named 'package.module:function'")
    isolation = getattr(config, "isolation", None) or IsolationConfig()
    with worker_pool(kernel, device, 1, isolation, family) as pool:
        info = pool.kernel_info()  # a kernel that does not import: the worker's one-line UserError
    if info.unavailable:
        raise UserError(f"kernel {kernel!r} is unavailable here: {info.unavailable}")
    if device not in info.devices:
        raise UserError(
            f"{option} {kernel!r} runs on {'/'.join(info.devices)}, not {device}; pass --device "
            f"{info.devices[0] if info.devices else 'cuda'} on a machine that has it"
        )


def check_kernel(
    kernel: str, device: str, option: str = "--kernel", config: Config | None = None, kernel_in_worker: bool = False
):
    """A known name (or an importable `package.module:function`, or a kernel family of `config`,
    entry points), installed, and able to run on `device`. Returns the adapter it built (a run
    plan keeps it), or None where a worker checked the kernel.

    `kernel_in_worker`: the run loads the kernel in a worker process, and the deciding
    process must never import a user kernel (`package.module:function`, or a family's entry
    points), not even to check it: a worker is started here and its first answer says whether the
    kernel imports, is installed and runs on `device` (the pool stays warm: the run reuses it)."""
    return checked_kernel(kernel, device, option, config, kernel_in_worker)[1]


def checked_kernel(
    kernel: str, device: str, option: str = "--kernel", config: Config | None = None, kernel_in_worker: bool = False
):
    """check_kernel's checks, and what they resolved: the kernel's registry entry (the one
    resolution of its name) and the adapter built here (None where a worker checked the kernel)."""
    from gate.kernels.registry import kernel_entry, kernel_names

    families = sorted(getattr(config, "kernels", None) or {}) if config is not None else []
    names = kernel_names() + [f for f in families if f not in kernel_names()]
    entry = kernel_entry(kernel, config)  # a family that takes a built-in's name is a UserError here
    if kernel_in_worker and (":" in kernel or entry.family is not None):
        _check_kernel_in_worker(entry, device, option, config)
        return entry, None
    try:
        adapter = entry.adapter()  # an unknown name, or a user kernel that does not import: a UserError
    except UserError:
        if ":" in kernel or kernel in names:
            raise
        raise UserError(
            f"{option} {kernel!r} is not a known kernel; choose one of {', '.join(names)}{nearest(kernel, names)}, "
            f"or name your own function as 'package.module:function' (`attn-gate kernels` lists them)"
        ) from None
    missing = adapter.unavailable_reason()
    if missing:
        runnable = [n for n in names if ":" not in n and n not in families and _runs_on(n, device)]
        raise UserError(
            f"kernel {kernel!r} is unavailable here: {missing}; on {device} try {', '.join(runnable) or 'none'}"
        )
    devices = adapter.capabilities().devices
    if device not in devices:
        raise UserError(
            f"{option} {kernel!r} runs on {'/'.join(devices)}, not {device}; pass --device "
            f"{devices[0]} on a machine that has it, or choose a {device} kernel (`attn-gate kernels`)"
        )
    return entry, adapter


def _runs_on(name: str, device: str) -> bool:
    from gate.kernels.registry import get_adapter

    try:
        adapter = get_adapter(name)
        return adapter.unavailable_reason() is None and device in adapter.capabilities().devices
    except Exception:
        return False


def check_suite(config: Config, suite: str, option: str = "--suite") -> None:
    names = suite_names(config.suites)
    if suite not in names:
        raise UserError(
            f"{option} {suite!r}: unknown suite {suite!r}; choose one of: {', '.join(names)}{nearest(suite, names)} "
            f"(`attn-gate suites` lists them; define your own under [tool.attn-gate.suites] in {config.source})"
        )


def check_only(only: str | None) -> None:
    Scope.of_only(only)  # an invalid regex is a one-line UserError


def validate_target(
    config: Config,
    kernel: str | None,
    suite: str | None,
    device: str | None,
    only: str | None = None,
    check_kernel_runs: bool = True,
    kernel_in_worker: bool = False,
) -> ValidTarget:
    """Resolve the defaults and check every name, in the order a user reads the command line:
    device, kernel, suite, --only. `check_kernel_runs=False` for commands that only read files
    (`baseline show`): the name must be known, the kernel need not be installed here.
    `kernel_in_worker`: the run is isolated; a user kernel is not imported here (check_kernel)."""
    device = check_device(device)
    profile = config.profile(device)
    # a value from the config file is named by its file and key, never blamed on a flag not given
    kernel_option = "--kernel" if kernel else config.profile_key(device, "kernel")
    suite_option = "--suite" if suite else config.profile_key(device, "suite")
    kernel = kernel or profile.kernel
    suite = suite or profile.suite
    entry = adapter = None
    if check_kernel_runs:
        entry, adapter = checked_kernel(kernel, device, kernel_option, config, kernel_in_worker)
    else:
        from gate.kernels.registry import kernel_names

        if (
            ":" not in kernel
            and kernel not in kernel_names()
            and kernel not in (getattr(config, "kernels", None) or {})
        ):
            raise UserError(
                f"{kernel_option} {kernel!r} is not a known kernel{nearest(kernel, kernel_names())}; "
                f"`attn-gate kernels` lists them"
            )
    check_suite(config, suite, suite_option)
    check_only(only)
    return ValidTarget(kernel, suite, device, adapter, entry)


def require_initialised(config: Config, kernel: str | None, writes: bool = False) -> None:
    """A repository whose pyproject.toml has no [tool.attn-gate] has not chosen a kernel: gating the
    built-in default against it (and writing that baseline into it) would be the wrong kernel. A
    command that `writes` a baseline refuses a folder without pyproject.toml too (an `init` that
    stopped leaves none), where the default's baseline would be written into a kernel repository."""
    if kernel:
        return
    if config.source != "defaults" and not config.section:
        raise UserError(
            f"{config.source} has no [tool.attn-gate] section: run `attn-gate init` to set up this "
            f"repository (or pass --kernel to name the kernel)"
        )
    if writes and config.source == "defaults":
        raise UserError(
            f"no pyproject.toml in {Path.cwd()}: run `attn-gate init` in your repository's root to set it "
            f"up (or pass --kernel to name the kernel, --config PATH/pyproject.toml for another file)"
        )
