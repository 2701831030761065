#!/usr/bin/env bash
# Build trimmed FA2 or FA3 wheels for an H100/H200 (sm_90) on a machine without a GPU (nvcc and a
# CUDA build of torch are needed; no GPU). docs/building-flash-attn.md explains the trims, the
# times and the memory they take.
#
#   scripts/build-flash-attn.sh [--dry-run] [--jobs N] [--out DIR] fa2
#   scripts/build-flash-attn.sh [--dry-run] [--jobs N] [--out DIR] fa3 --src DIR [--fp8]
#
# fa2: flash-attn's own source distribution from the package index (FA2_VERSION, default 2.8.3.post2),
#      head dims 64 and 128 only (33-64 and 97-128 dispatch to them; any other head dim raises
#      "not compiled"), FLASH_ATTN_CUDA_ARCHS=90.
# fa3: that sdist ships hopper/ without its CUDA sources, so --src names a flash-attention source tree
#      the user provides (hopper/ and the csrc/cutlass submodule); head dims 64 and 128 (72-128 run the
#      128 kernel), bf16/fp16, no FP8/softcap/pack-GQA/SM80 paths, sm_90a, without -lineinfo;
#      --fp8 keeps the e4m3 forward kernels (the nightly's fp8 cases need them).
# --dry-run prints every step and runs none. Wheels land in --out (default dist-flash/).
set -euo pipefail

usage() { sed -n '5,6p' "$0" | sed 's/^# *//' >&2; exit 2; }
dry=0 jobs=${MAX_JOBS:-2} out=dist-flash src="" what="" fp8=0
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --jobs) jobs=${2:?--jobs N}; shift ;;
    --out) out=${2:?--out DIR}; shift ;;
    --src) src=${2:?--src DIR}; shift ;;
    --fp8) fp8=1 ;;
    fa2|fa3) what=$1 ;;
    -h|--help) usage ;;
    *) echo "build-flash-attn: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[ -n "$what" ] || usage
fa2_version=${FA2_VERSION:-2.8.3.post2}
work=${BUILD_DIR:-build-flash}/$what

step() {  # print a step; run it unless --dry-run
  echo "+ $*"
  if [ "$dry" = 0 ]; then "$@"; fi
}

# Each nvcc peaks at ~6 GB: two jobs fit a 16 GB machine; one thread per nvcc keeps it so.
export MAX_JOBS=$jobs NVCC_THREADS=1 FLASH_ATTENTION_FORCE_BUILD=TRUE
if [ "$dry" = 0 ]; then
  command -v nvcc >/dev/null || { echo "build-flash-attn: nvcc not found: install the CUDA toolkit (12.3+) and put it on PATH" >&2; exit 2; }
  python3 -c "import torch, sys; sys.exit(torch.version.cuda is None)" \
    || { echo "build-flash-attn: needs a CUDA build of torch (the version the GPU machine runs)" >&2; exit 2; }
fi
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  # torch takes the toolkit root from nvcc's folder; where nvcc on PATH is a wrapper script
  # (/usr/local/bin/nvcc) that root has no CUDA headers, so take the one nvcc itself reports
  top=$( { nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 || true; } | sed -n 's/^#\$ TOP=//p' | head -n 1)
  if [ -n "$top" ] && CUDA_HOME=$(cd "$top" 2>/dev/null && pwd); then
    export CUDA_HOME
    echo "+ export CUDA_HOME=$CUDA_HOME"
  fi
fi

if [ "$what" = fa2 ]; then
  export FLASH_ATTN_CUDA_ARCHS=90
  step mkdir -p "$work" "$out"
  # the sdist's metadata step runs setup.py, which wants CUDA_HOME unless told to skip the build
  step env FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE python3 -m pip download --no-deps --no-binary :all: \
    --no-build-isolation "flash-attn==$fa2_version" -d "$work"
  step tar -xzf "$work/flash_attn-$fa2_version.tar.gz" -C "$work"
  tree=$work/flash_attn-$fa2_version
  echo "+ trim $tree/setup.py: kernels of head dims 64 and 128 only, a head-dim switch that raises for the rest"
  if [ "$dry" = 0 ]; then
    python3 - "$tree" <<'PY'
import pathlib, re, sys

tree = pathlib.Path(sys.argv[1])
setup = tree / "setup.py"
text = setup.read_text()
(tree / "csrc/flash_attn/fa2_trim_headdim.h").write_text(r"""#pragma once
#include "static_switch.h"
#include <c10/util/Exception.h>
#undef HEADDIM_SWITCH
#define HEADDIM_SWITCH(HEADDIM, ...)                                              \
  [&] {                                                                           \
    if (HEADDIM > 32 && HEADDIM <= 64) {                                          \
      constexpr static int kHeadDim = 64;                                         \
      return __VA_ARGS__();                                                       \
    } else if (HEADDIM > 96 && HEADDIM <= 128) {                                  \
      constexpr static int kHeadDim = 128;                                        \
      return __VA_ARGS__();                                                       \
    } else {                                                                      \
      TORCH_CHECK(false, "flash_attn_2_cuda (trimmed build): head dim ", HEADDIM, \
                  " not compiled; only head dims 33-64 and 97-128 are built");   \
    }                                                                             \
  }()
""")
kernel = re.compile(r'^\s*"csrc/flash_attn/src/flash_\w+_hdim(\d+)_\w+\.cu",\n', re.M)
kept = [m for m in kernel.finditer(text) if m.group(1) in ("64", "128")]
if not kept:
    sys.exit(f"{setup}: no hdim64/hdim128 kernel sources found: this flash-attn version lays setup.py out differently")
text = kernel.sub(lambda m: m.group(0) if m.group(1) in ("64", "128") else "", text)
text, n = re.subn(r'"cxx": compiler_c17_flag,', '"cxx": compiler_c17_flag + ["-include", "fa2_trim_headdim.h"],', text, count=1)
if n != 1:
    sys.exit(f"{setup}: found no cxx flags to add the head-dim switch to")
text = text.replace('"-lineinfo",', '# "-lineinfo",')  # ~3x smaller device code
setup.write_text(text)
# the trim, where attn-gate's FA2 adapter reads it: the other head dims are SKIPPED with this reason
(tree / "flash_attn" / "attn_gate_build.py").write_text(
    '"""Written by attn-gate\'s scripts/build-flash-attn.sh: this flash-attn build is trimmed."""\n\n'
    "# head dims 33-64 run the 64 kernel, 97-128 the 128 kernel; no other head dim is compiled\n"
    "HEAD_DIM_KERNELS = (64, 128)\n")
print(f"kept {len(kept)} kernel sources; wrote flash_attn/attn_gate_build.py")
PY
  fi
  step python3 -m pip wheel --no-deps --no-build-isolation -w "$out" "$tree"
else
  [ -n "$src" ] || { echo "build-flash-attn: fa3 needs --src DIR, a flash-attention source tree with hopper/ and csrc/cutlass (see docs/building-flash-attn.md)" >&2; exit 2; }
  if [ "$dry" = 0 ]; then
    [ -f "$src/hopper/setup.py" ] || { echo "build-flash-attn: $src/hopper/setup.py not found: --src is the repository root" >&2; exit 2; }
    [ -d "$src/csrc/cutlass/include" ] || { echo "build-flash-attn: $src/csrc/cutlass is empty: git submodule update --init csrc/cutlass" >&2; exit 2; }
  fi
  export TORCH_CUDA_ARCH_LIST=9.0a FLASH_ATTENTION_OFFLINE_BUILD=1
  disabled="SOFTCAP PACKGQA SM80 HDIM96 HDIM192 HDIM256 HDIMDIFF64 HDIMDIFF192"
  [ "$fp8" = 1 ] || disabled="FP8 $disabled"
  for f in $disabled; do
    export "FLASH_ATTENTION_DISABLE_$f=TRUE"
    echo "+ export FLASH_ATTENTION_DISABLE_$f=TRUE"
  done
  step mkdir -p "$out"
  # -lineinfo triples the device code; upstream marks it "disable this for release". A copy is kept.
  step sed -i.orig 's/^\( *\)"-lineinfo",/\1# "-lineinfo",/' "$src/hopper/setup.py"
  step python3 -m pip wheel --no-deps --no-build-isolation -w "$out" "$src/hopper"
fi
echo "build-flash-attn: $what done$([ "$dry" = 1 ] && echo ' (dry run: nothing was run)'); wheels in $out"
