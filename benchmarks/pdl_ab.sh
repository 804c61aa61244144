#!/usr/bin/env bash
# The device call of 2026-12-07 (benchmarks/README.md, "Programmatic dependent launch"), as it ran: the GPU tests of
# PDL, the ResBlock tail and the top-k; then graphed step times, before (a copy of the engine of 50a95aa in _before/,
# made in the repo root first: `mkdir _before && git archive 50a95aa engine trees | tar -x -C _before`) against after
# with PDL on (MEDUSA_WORKBENCH_PDL=1: then the default, so set here for the tests too); then PDL broken on purpose
# (no wait) to show the tests fail; then the 7B step with 128-key splits (8 live at its 1,024-key prefix instead of
# 4); then the small shapes with PDL off.
# The "after" of that call also loaded the attention merge's splits as one tile, measured slower and since dropped.
#   LIMIT=570 bash benchmarks/pdl_ab.sh   (output in $OUT: tests1.log, tests2.log, ab.jsonl, broken.log)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$SECONDS
LIMIT=${LIMIT:-590}
left() { echo $((LIMIT-SECONDS+t0)); }
MEDUSA_WORKBENCH_PDL=1 timeout 150 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rs tests/test_graphs_gpu.py tests/test_kernels_gpu.py \
  -m gpu_quick -k "attention or dependent_launch or eager_ar_on_the_demo or batched_triton or resblock" \
  > $OUT/tests1.log 2>&1; echo "tests1 exit $? $((SECONDS-t0)) s"; tail -3 $OUT/tests1.log
MEDUSA_WORKBENCH_PDL=1 timeout 90 python3 -m pytest -p no:cacheprovider -o addopts="" -q tests/test_greedy_step_gpu.py -m gpu_quick > $OUT/tests2.log 2>&1
echo "tests2 exit $? $((SECONDS-t0)) s"; tail -2 $OUT/tests2.log
ab() { local dir=$1 label=$2 flag=$3; shift 3; local t=$SECONDS
  (cd $dir && MEDUSA_WORKBENCH_PDL=$flag PYTHONPATH=. timeout 150 python3 $BENCH --label $label --no-attention "$@") >> $OUT/ab.jsonl 2>> $OUT/ab.err
  echo "$label exit $? $((SECONDS-t)) s"; }
BENCH=$PWD/benchmarks/step_ab.py
ab _before before_auto 1 --shapes llama2-7b --gemm auto --sizes 64
ab . pdl_auto 1 --shapes llama2-7b --gemm auto --sizes 64
[ $(left) -gt 150 ] && ab _before before_cublas 1 --shapes demo,smollm2-135m --sizes 63
[ $(left) -gt 90 ] && ab . pdl_cublas 1 --shapes demo,smollm2-135m --sizes 63
if [ $(left) -gt 110 ]; then
  cp engine/kernels/pdl.py /tmp/pdl_good.py
  sed -i 's/^            gdc_wait()$/            pass  # broken on purpose/' engine/kernels/pdl.py; grep -n "broken" engine/kernels/pdl.py
  MEDUSA_WORKBENCH_PDL=1 timeout 100 python3 -m pytest -p no:cacheprovider -o addopts="" -q tests/test_graphs_gpu.py \
    -k "dependent_launch or (eager_ar_on_the_demo and triton) or batch_with_requests" > $OUT/broken.log 2>&1
  echo "broken exit $?"; tail -4 $OUT/broken.log; cp /tmp/pdl_good.py engine/kernels/pdl.py
fi
[ $(left) -gt 80 ] && ab . pdl_auto_split128 1 --shapes llama2-7b --gemm auto --sizes 64 --min-split 128
[ $(left) -gt 80 ] && ab . merge_cublas 0 --shapes demo,smollm2-135m --sizes 63
echo "total $((SECONDS-t0)) s"
