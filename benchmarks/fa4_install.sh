#!/usr/bin/env bash
# FlashAttention-4 (flash-attn-4 4.0.0b36, CuTe DSL; pure Python over prebuilt DSL libraries) for the
# `flash_attn` backend and the FA4 peer columns, on a GPU machine that cannot reach a registry.
#
#   bash benchmarks/fa4_install.sh pack              here (with network): wheels -> .fa4a/ and .fa4b/
#   bash benchmarks/fa4_install.sh install DEST A B  there: parts in folders A and B -> DEST
#   export FLASH_ATTN_SITE=DEST                      then engine/kernels/flash4.py finds it
#
# Why two parts: the device tool carries at most 64 MiB per call (the repo counts), and the CUDA 13
# DSL wheel alone is 92 MB. Unpacked and re-compressed with xz it is 64 MB, split over two calls;
# the machine keeps files between calls made within its idle time, so part A is copied out of the
# repo (to ~/w) by the first call and joined with part B in the second. The wheels are installed
# first and the CUDA 13 tree unpacked over them: both ship the top-level folder nvidia_cutlass_dsl/,
# and a second `pip install --target` would replace it.
set -euo pipefail
WHEELS="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
nvidia-cutlass-dsl-libs-core==4.8.1 apache-tvm-ffi==0.1.15.post2 quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5"
CU13="nvidia-cutlass-dsl-libs-cu13==4.8.1"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64"

case "${1:-}" in
pack)
  tmp=$(mktemp -d)
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
    -d "$tmp/wheels" $WHEELS $CU13
  mkdir -p "$tmp/cu13" .fa4a .fa4b .git/info
  unzip -q "$tmp"/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl -d "$tmp/cu13"
  rm "$tmp"/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl
  (cd "$tmp/cu13" && tar cf - . | xz -T0 -9 > "$tmp/cu13.tar.xz")
  split -b 36000000 "$tmp/cu13.tar.xz" "$tmp/cu13.tar.xz."
  mv "$tmp/cu13.tar.xz.aa" .fa4a/
  mv "$tmp"/cu13.tar.xz.a[b-z] "$tmp"/wheels/*.whl .fa4b/
  rm -rf "$tmp"
  grep -qsx '/.fa4a/' .git/info/exclude || printf '/.fa4a/\n/.fa4b/\n' >> .git/info/exclude
  du -sh .fa4a .fa4b
  ;;
install)
  dest=$2 a=$3 b=$4
  mkdir -p "$dest"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dest" "$b"/*.whl
  cat "$a"/cu13.tar.xz.* "$b"/cu13.tar.xz.* | xz -d | tar x -C "$dest"
  FLASH_ATTN_SITE=$dest python3 -c "from engine.kernels import flash4; print(flash4.unavailable_reason() or 'FA4 importable')"
  ;;
*)
  sed -n 2,8p "$0"; exit 2 ;;
esac
