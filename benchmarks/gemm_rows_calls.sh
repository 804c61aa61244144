#!/usr/bin/env bash
# The device calls of 2026-12-07, twenty-second session (benchmarks/README.md, "Unsplit GEMMs at 64 rows"), as they
# ran, each on a fresh H100. Output in $OUT. What engine each ran:
#   bash benchmarks/gemm_rows_calls.sh 1   (2243b0e) GPU tests (graphs traced and untraced, the ResBlock tail, tree
#                                          attention), the demo's traced host time, then the 7B shape's GEMMs at 64 and
#                                          65 rows: cuBLAS against every configuration of ours and of the variants
#                                          (benchmarks/gemm_rows_sweep.py; ours without unsplit configs where K may split)
#   bash benchmarks/gemm_rows_calls.sh 2   (this stop's engine with benchmarks/patches/gemv_tail_first.diff) the skinny
#                                          GEMM's tests, then graphed steps (benchmarks/step_ab.py, 63 and 64 nodes):
#                                          the 7B shape with ours and `auto` (PDL on), ours before (a copy of 2243b0e's
#                                          engine in _before/, made in the repo root first: `mkdir _before && git archive
#                                          2243b0e engine trees | tar -x -C _before`) and cuBLAS (PDL off); then the demo
#                                          and SmolLM2 shapes likewise
#   bash benchmarks/gemm_rows_calls.sh 3   (this stop's engine with benchmarks/patches/gemv_tail.diff as it was before
#                                          its if/else fix: `_tile_rows` returned inside `if SWAP:`, and the sweep's
#                                          `**gemv.tiles(m)`) the same tests, then on a copy (_broken/, made from the
#                                          checkout) whose tail's last `_finish_rows` was given SPLIT_K 1; the 7B GEMMs
#                                          at 65 rows; graphed steps: 7B with ours and `auto` (PDL on), the small
#                                          shapes with ours (PDL on and off) and cuBLAS with PDL. Its kernel did not
#                                          compile: every run with ours failed
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
ROOT=$PWD; t0=$SECONDS; LIMIT=${LIMIT:-570}
left() { echo $((LIMIT-SECONDS+t0)); }
tests() {
  timeout 150 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rfE --tb=short tests/test_graphs_gpu.py \
    tests/test_kernels_gpu.py tests/test_greedy_step_gpu.py -m gpu_quick \
    -k "graphed or traced or queued or tree_attention or resblock or fused_tree_steps" > $OUT/tests.log 2>&1
  echo "tests exit $? $((SECONDS-t0)) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -5
}
host() {
  PYTHONPATH=. timeout 60 python3 benchmarks/traced_host_profile.py demo > $OUT/host.txt 2>&1
  echo "host exit $? $((SECONDS-t0)) s"; grep -hE "^(ar|medusa) " $OUT/host.txt
}
sweep() {  # the 65-row GEMMs first: they are what a 64-node step runs
  [ $(left) -lt 40 ] && { echo "sweep $* skipped"; return; }
  PYTHONPATH=. timeout $(( $(left) - 10 )) python3 benchmarks/gemm_rows_sweep.py "$@" >> $OUT/sweep.jsonl 2>> $OUT/sweep.err
  echo "sweep $* exit $? $((SECONDS-t0)) s"
}
BENCH=$ROOT/benchmarks/step_ab.py
[ -d _before ] && { [ -e _before/models ] || ln -s ../models _before/models; }
ab() { local dir=$1 label=$2 pdl=$3 shapes=$4; shift 4; local t=$SECONDS
  [ $(left) -lt 60 ] && { echo "$label skipped"; return; }
  (cd $dir && MEDUSA_WORKBENCH_PDL=$pdl PYTHONPATH=. timeout $(( $(left) < 150 ? $(left) - 5 : 150 )) \
    python3 $BENCH --label $label --no-attention --shapes $shapes --sizes 63,64 "$@") >> $OUT/ab.jsonl 2>> $OUT/ab.err
  echo "$label exit $? $((SECONDS-t)) s"; }
gemm_tests() { local dir=$1 log=$2; local t=$SECONDS
  (cd $dir && timeout 170 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rfE --tb=short tests/test_kernels_gpu.py \
    -m gpu_quick -k "skinny or split_k or auto_gemm or our_gemm") > $OUT/$log 2>&1
  echo "tests in $dir exit $? $((SECONDS-t)) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$log | tail -8; }
part=${1:-1}
if [ "$part" = 1 ]; then
  tests
  host
  sweep --rows 65,64 --matrices o,down,qkv,gate_up --variants skinny,rows
  sweep --rows 65,64 --matrices o,down,qkv,gate_up --variants tma  # apart: a TMA fault would end the process
elif [ "$part" = 2 ]; then
  gemm_tests . tests.log
  ab . 7b_skinny_pdl 1 llama2-7b --gemm skinny
  ab _before 7b_before_skinny_pdl 1 llama2-7b --gemm skinny
  ab . 7b_auto_pdl 1 llama2-7b --gemm auto
  ab . 7b_cublas 0 llama2-7b --gemm cublas
  ab . small_skinny_pdl 1 demo,smollm2-135m --gemm skinny
  ab . small_auto_pdl 1 demo,smollm2-135m --gemm auto
  ab . small_cublas 0 demo,smollm2-135m --gemm cublas
elif [ "$part" = 3 ]; then
  gemm_tests . tests.log
  gemm_tests _broken tests_broken.log
  ab . 7b_skinny_pdl 1 llama2-7b --gemm skinny
  ab . small_skinny_pdl 1 demo,smollm2-135m --gemm skinny
  sweep --rows 65 --matrices o,down,qkv,gate_up --variants skinny
  ab . 7b_auto_pdl 1 llama2-7b --gemm auto
  ab . small_skinny 0 demo,smollm2-135m --gemm skinny
  ab . small_cublas_pdl 1 demo,smollm2-135m --gemm cublas
fi
echo "total $((SECONDS-t0)) s"
