"""Where a run happened: GPU class, driver, CUDA, torch, kernel version. Recorded with every
result, checked before any comparison (a baseline from another GPU class is refused)."""

from __future__ import annotations

import platform
import re

import torch

import gate


def gpu_class(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100'."""
    name = name.lower().replace("nvidia", "").replace("geforce", "").strip()
    m = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]?)\b", name.replace("-", " "))
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            return drv.decode() if isinstance(drv, bytes) else str(drv)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return "unknown"


def describe(device: str, kernel: str, kernel_version: str) -> dict[str, str]:
    env = {
        "device": device, "torch": torch.__version__, "python": platform.python_version(),
        "attn_gate": gate.__version__, "kernel": kernel, "kernel_version": kernel_version,
        "machine": platform.machine(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu_name=props.name, gpu_class=gpu_class(props.name), cuda=str(torch.version.cuda),
                   driver=_driver(), compute_capability=f"{props.major}.{props.minor}")
    else:
        env.update(gpu_name="none", gpu_class="cpu", cuda="none", driver="none",
                   cpu=platform.processor() or platform.machine())
    return env


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
