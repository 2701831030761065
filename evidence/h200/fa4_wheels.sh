#!/usr/bin/env bash
# FA4's wheels (~100 MB) in two halves small enough to ride one device call each (64 MiB per call,
# the repo itself ~20 MB on 2026-12-01e: a half of 37 MB leaves ~10 MB to grow), so FA4 is installed by the second call of a session instead of the third.
# The one big wheel (nvidia-cutlass-dsl-libs-cu13, 92 MB as a zip) is unpacked and re-compressed with
# xz (-9e: 64 MB), and split across the halves with the small wheels.
#
#   bash evidence/h200/fa4_wheels.sh pack [A B]      # here: .wheels/a + .wheels/b (../shared/tools/offline-wheels.sh)
#                                                    #   -> .wheels/x1 and .wheels/x2 (git-ignored), ~2 minutes
#   bash evidence/h200/fa4_wheels.sh install STAGE [TARGET]   # on the device, STAGE holding both halves' files:
#                                                    #   installs into TARGET (/tmp/site), prints the PYTHONPATH export
#
# The installed tree equals `pip install --target` of all the wheels at once (the small wheels are pip-installed
# first, then the big one's files are unpacked over them: they share the nvidia_cutlass_dsl folder, which a second
# `pip install --target --upgrade` would replace). Only the big wheel's RECORD/INSTALLER differ.
set -euo pipefail
cmd=${1:?usage: fa4_wheels.sh pack [A B] | install STAGE [TARGET]}
case "$cmd" in
pack)
  a=${2:-.wheels/a}; b=${3:-.wheels/b}
  [ -f "$a/part.aa" ] && [ -f "$b/part.ab" ] && [ -f "$b/bigname" ] || {
    echo "fa4_wheels.sh pack: $a/part.aa, $b/part.ab and $b/bigname are needed (../shared/tools/offline-wheels.sh .wheels makes them)" >&2
    exit 2; }
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  cat "$a/part.aa" "$b/part.ab" > "$tmp/big.whl"
  mkdir "$tmp/big" && unzip -q "$tmp/big.whl" -d "$tmp/big"  # unzip keeps the files' modes (the .so are executable)
  tar -cf - -C "$tmp/big" . | xz -9e -T2 > "$tmp/big.tar.xz"
  small=$(cat "$a"/*.whl | wc -c); big=$(stat -c %s "$tmp/big.tar.xz")
  first=$(( (small + big) / 2 - small ))  # both halves about the same size
  rm -rf .wheels/x1 .wheels/x2 && mkdir -p .wheels/x1 .wheels/x2
  cp "$a"/*.whl .wheels/x1/
  head -c "$first" "$tmp/big.tar.xz" > .wheels/x1/big.tar.xz.part1
  tail -c +"$(( first + 1 ))" "$tmp/big.tar.xz" > .wheels/x2/big.tar.xz.part2
  sha256sum "$tmp/big.tar.xz" | cut -d' ' -f1 > .wheels/x2/big.tar.xz.sha256
  du -sh .wheels/x1 .wheels/x2
  ;;
install)
  stage=${2:?usage: fa4_wheels.sh install STAGE [TARGET]}; target=${3:-/tmp/site}
  for f in big.tar.xz.part1 big.tar.xz.part2 big.tar.xz.sha256; do
    [ -f "$stage/$f" ] || { echo "fa4_wheels.sh install: $stage/$f missing (carry .wheels/x1 and .wheels/x2)" >&2; exit 2; }
  done
  [ "$(cat "$stage"/big.tar.xz.part1 "$stage"/big.tar.xz.part2 | sha256sum | cut -d' ' -f1)" = "$(cat "$stage/big.tar.xz.sha256")" ] || {
    echo "fa4_wheels.sh install: the two halves in $stage do not join to the packed file (sha256 differs); pack again" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" "$stage"/*.whl >&2
  cat "$stage"/big.tar.xz.part1 "$stage"/big.tar.xz.part2 |
    python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1], filter='data')" "$target"
  echo "export PYTHONPATH=$target:$target/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
  ;;
*) echo "fa4_wheels.sh: unknown command $cmd (pack or install)" >&2; exit 2 ;;
esac
