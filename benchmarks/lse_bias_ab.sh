#!/usr/bin/env bash
# The device call of 2026-12-07, twentieth session (benchmarks/README.md, "Untraced steps skip the log-sum-exps"), as it
# ran but for two last runs (below): the quick GPU tests of the greedy step, kernels and graphs (160 s allowed), then
# graphed step times before (a copy of the engine of c49b2c8 in _before/, made in the repo root first:
# `mkdir _before && git archive c49b2c8 engine trees | tar -x -C _before`) and after, PDL off, cuBLAS.
# The call then ran the 7B shape twice from an uncommitted copy of the engine with a weight prefetch in our GEMM;
# both failed at their first launch (a launch-argument bug in that copy): ab.jsonl holds only their header lines.
#   LIMIT=330 bash benchmarks/lse_bias_ab.sh   (output in $OUT: tests.log, ab.jsonl)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$SECONDS; LIMIT=${LIMIT:-575}
left() { echo $((LIMIT-SECONDS+t0)); }
BENCH=$PWD/benchmarks/step_ab.py
ab() { local dir=$1 label=$2 flag=$3; shift 3; local t=$SECONDS
  (cd $dir && MEDUSA_WORKBENCH_PDL=$flag PYTHONPATH=. timeout $(( $(left) < 150 ? $(left) : 150 )) python3 $BENCH --label $label --no-attention "$@") >> $OUT/ab.jsonl 2>> $OUT/ab.err
  echo "$label exit $? $((SECONDS-t)) s"; }
timeout 160 python3 -m pytest -p no:cacheprovider -o addopts="" -q -x tests/test_greedy_step_gpu.py tests/test_kernels_gpu.py \
  tests/test_graphs_gpu.py -m gpu_quick -k "not flash" > $OUT/tests.log 2>&1
echo "tests exit $? $((SECONDS-t0)) s"; tail -3 $OUT/tests.log
ab _before before1 0 --shapes demo,smollm2-135m --sizes 63
ab . after1 0 --shapes demo,smollm2-135m --sizes 63
echo "total $((SECONDS-t0)) s"
