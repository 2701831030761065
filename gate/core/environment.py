"""Where a run happened: GPU class, driver, CUDA, torch, kernel version. Recorded with every
result, checked before any comparison (a baseline from another GPU class is refused)."""

from __future__ import annotations

import hashlib
import platform
import re
import socket
import subprocess

import torch

import gate


def gpu_class(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100'."""
    name = name.lower().replace("nvidia", "").replace("geforce", "").strip()
    m = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]?)\b", name.replace("-", " "))
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def _nvml(read, default: str) -> str:
    """One NVML reading (`read(pynvml)`) as a string; `default` where NVML is absent or fails."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            value = read(pynvml)
            return value.decode() if isinstance(value, bytes) else str(value)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return default


def _driver() -> str:
    return _nvml(lambda nv: nv.nvmlSystemGetDriverVersion(), "unknown")


def cpu_model() -> str:
    """'AMD EPYC 7763 64-Core Processor': what `platform.machine()` ('x86_64') does not say, and
    what moves CPU ratios (another model takes other code paths in torch's CPU kernels)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capability() -> str:
    """torch's dispatch level for CPU kernels (DEFAULT, AVX2, AVX512, ...): two machines with
    different levels run different code for the same op."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return "unknown"


def git_commit(folder: str | None = None) -> str:
    """The commit the working tree is at ('' outside git), with '+dirty' when it has changes:
    a baseline records it so a report can link to the code it was measured with."""

    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return sha.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def cudnn_version() -> str:
    """The cuDNN that torch loaded ('91900' for 9.19.0; 'none' without one). It is SDPA-cuDNN's kernel and
    the default speed anchor, so a new one moves cuDNN's results and every speed ratio; the torch
    version alone does not say it (pip can swap nvidia-cudnn under the same torch). On the H200, the
    sdpa-cudnn dout_noncontig failures of one run did not show in an earlier one with the same torch,
    and nothing recorded which cuDNN either had."""
    try:
        return str(torch.backends.cudnn.version() or "none")
    except Exception:
        return "unknown"


HOST_DIGITS = 12  # hex digits of a host id: 48 bits tell a pool's hosts apart and give back no serial


def host_digest(raw: str) -> str:
    """A host id as committed files keep it: the first HOST_DIGITS hex digits of the sha256 of the raw
    identity ('GPU-' prefix and case dropped: torch and NVML spell one UUID both ways); '' for none."""
    raw = raw.strip().lower().removeprefix("gpu-")
    return hashlib.sha256(raw.encode()).hexdigest()[:HOST_DIGITS] if raw else ""


def _gpu_uuid() -> str:
    """The UUID of the GPU that timed the run: torch's device 0 (the one CUDA_VISIBLE_DEVICES
    exposes first), else NVML's first GPU; '' when neither says."""
    try:
        uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
        if uuid:
            return str(uuid)
    except Exception:
        pass
    return _nvml(lambda nv: nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0)), "")


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="utf-8") as fh:
                found = fh.read().strip()
            if found:
                return found
        except OSError:
            pass
    return socket.gethostname()


def host_id(device: str) -> str:
    """Which machine timed a speed run: a digest of the GPU's UUID on CUDA (speed ratios of one GPU
    class move a few % from one host to another), of the machine id (else the hostname) on a CPU.
    '' when unknown. Kept out of `describe`: sweep shards on two GPUs of one run still merge."""
    return host_digest(_gpu_uuid() if device == "cuda" else _machine_id())


def describe(device: str, kernel: str, kernel_version: str) -> dict[str, str]:
    env = {
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "attn_gate": gate.__version__,
        "kernel": kernel,
        "kernel_version": kernel_version,
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_capability": cpu_capability(),
        "git_commit": git_commit(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=props.name,
            gpu_class=gpu_class(props.name),
            cuda=str(torch.version.cuda),
            driver=_driver(),
            compute_capability=f"{props.major}.{props.minor}",
            cudnn=cudnn_version(),
        )
    else:
        env.update(
            gpu_name="none", gpu_class="cpu", cuda="none", driver="none", cpu=platform.processor() or platform.machine()
        )
    return env


def release_cached_gpu_memory(device: str) -> None:
    """Give the blocks this process's caching allocator keeps back to the GPU (a no-op off CUDA).
    A sweep's worker, its judging parent and other sweeps of one host can share one
    GPU: a large case's peak kept cached by one made the others' cases fail out of memory (47 of 103
    ERROR rows of sweeps sharing one H200). Timing calls it between cases too."""
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
