"""scripts/build-flash-attn.sh: its --dry-run prints the steps a real build would run (a real build
takes the CPUs for half an hour; docs/building-flash-attn.md has the measured figures)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build-flash-attn.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_fa2_dry_run_builds_from_the_package_index_sdist():
    r = run("--dry-run", "fa2")
    assert r.returncode == 0, r.stderr
    assert "pip download --no-deps --no-binary :all:" in r.stdout and "flash-attn==2.8.3.post2" in r.stdout
    assert "head dims 64 and 128" in r.stdout and "pip wheel" in r.stdout and "nothing was run" in r.stdout


def test_fa3_dry_run_takes_a_user_supplied_tree_with_the_trim_switches():
    r = run("--dry-run", "fa3", "--src", "/src/flash-attention")
    assert r.returncode == 0, r.stderr
    for switch in ("FP8", "SOFTCAP", "PACKGQA", "SM80", "HDIM96", "HDIM192", "HDIM256"):
        assert f"FLASH_ATTENTION_DISABLE_{switch}=TRUE" in r.stdout
    assert "-lineinfo" in r.stdout and "/src/flash-attention/hopper" in r.stdout
    missing = run("--dry-run", "fa3")
    assert missing.returncode == 2 and "needs --src DIR" in missing.stderr


def test_bad_arguments_are_usage_errors():
    assert run("fa5").returncode == 2 and run().returncode == 2
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_cuda_home_is_the_root_nvcc_reports_when_nvcc_is_a_wrapper(tmp_path):
    """torch takes CUDA_HOME from nvcc's folder; a wrapper script there (/usr/local/bin/nvcc) names a
    root without the CUDA headers, so the script takes the root nvcc itself reports."""
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    nvcc = wrappers / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "#$ _HERE_={toolkit}/bin"\necho "#$ TOP={toolkit}/bin/.."\n')
    nvcc.chmod(0o755)
    env = {"PATH": f"{wrappers}:/usr/bin:/bin"}

    def dry(extra: dict) -> str:
        r = subprocess.run(
            ["bash", str(SCRIPT), "--dry-run", "fa2"], capture_output=True, text=True, timeout=60, env={**env, **extra}
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert f"+ export CUDA_HOME={toolkit}\n" in dry({})
    assert "CUDA_HOME" not in dry({"CUDA_HOME": "/opt/cuda"})  # a user's own setting stands
    nvcc.write_text("#!/bin/sh\necho 'nvcc fatal' >&2\nexit 1\n")  # an nvcc that cannot say: torch's own guess
    assert "CUDA_HOME" not in dry({})
