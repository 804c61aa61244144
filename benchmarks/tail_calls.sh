#!/usr/bin/env bash
# The device calls of 2026-12-07, twenty-third session (benchmarks/README.md, "The 65th row on the GPU"), as they ran.
# Output in $OUT. _tail/ is the engine with benchmarks/patches/gemv_tail.diff and attention_tail.diff applied, made in
# the repo root first: `mkdir _tail && git archive HEAD engine trees tests benchmarks | tar -x -C _tail && cd _tail &&
# patch -p1 < ../benchmarks/patches/gemv_tail.diff && patch -p1 < ../benchmarks/patches/attention_tail.diff`.
#   bash benchmarks/tail_calls.sh 1   the tails' GPU tests (skinny GEMM, K split, tree attention) in _tail/; graphed
#                                     7B steps of 63 and 64 nodes (benchmarks/step_ab.py) with `auto` and PDL, _tail/
#                                     then the checkout; the checkout's ResBlock and traced-heads quick tests; the
#                                     demo's traced AR at 16, 32 and 64 steps a heads pass; _tail/ with ours and PDL.
#                                     (Its traced_host_profile.py was then the first version: each variant's best of
#                                     three runs in a row, not rounds in turn; `--no-profile` for no cProfile.)
#   bash benchmarks/tail_calls.sh 2   (_before/: `mkdir _before && git archive 168b573 engine trees | tar -x -C _before`,
#                                     the engine before the ring's write moved into the verification kernel) the
#                                     greedy-step and graph tests of the ring and traced runs; the demo's traced and
#                                     untraced runs (benchmarks/traced_host_profile.py, rounds interleaved), before /
#                                     after / before / after in four processes; the demo end to end, traced, 4 rounds
#   bash benchmarks/tail_calls.sh 3   (both engines with benchmarks/patches/freeze_heap.diff, which engine.load then
#                                     had and which was then dropped: `.` the ring's write in greedy_accept, _before/
#                                     168b573) the same traced runs, after / before / after / before; then the demo
#                                     end to end, traced, from both
#   bash benchmarks/tail_calls.sh 4   (the ring's write, the last heads pass replayed from the full pass's graph, and
#                                     freeze_heap.diff) the graph tests of traced runs; the demo's traced runs at 600
#                                     and 256 tokens (the latter also at 32 steps a heads pass, which makes a new ring
#                                     and so new graphs at every switch); the demo end to end, traced
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
ROOT=$PWD; t0=$SECONDS; LIMIT=${LIMIT:-560}
left() { echo $((LIMIT-SECONDS+t0)); }
BENCH=$ROOT/benchmarks/step_ab.py
for d in _tail _before; do [ -d $d ] && { [ -e $d/models ] || ln -s ../models $d/models; }; done
pytests() { local dir=$1 log=$2 limit=$3; shift 3; local t=$SECONDS
  [ $(left) -lt 40 ] && { echo "tests $log skipped"; return; }
  (cd $dir && timeout $(( $(left) < limit ? $(left) - 5 : limit )) python3 -m pytest -p no:cacheprovider -o addopts="" \
    -q -rfE --tb=short "$@") > $OUT/$log 2>&1
  echo "tests $log in $dir exit $? $((SECONDS-t)) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$log | tail -8; }
ab() { local dir=$1 label=$2 pdl=$3 shapes=$4; shift 4; local t=$SECONDS
  [ $(left) -lt 60 ] && { echo "$label skipped"; return; }
  (cd $dir && MEDUSA_WORKBENCH_PDL=$pdl PYTHONPATH=. timeout $(( $(left) < 150 ? $(left) - 5 : 150 )) \
    python3 $BENCH --label $label --no-attention --shapes $shapes --sizes 63,64 "$@") >> $OUT/ab.jsonl 2>> $OUT/ab.err
  echo "$label exit $? $((SECONDS-t)) s"; }
host() { local dir=${DIR:-.} t=$SECONDS
  [ $(left) -lt 50 ] && { echo "host skipped"; return; }
  echo "== $dir $*" >> $OUT/host.txt
  (cd $dir && PYTHONPATH=. timeout $(( $(left) < 90 ? $(left) - 5 : 90 )) python3 $ROOT/benchmarks/traced_host_profile.py \
    demo "$@" > $OUT/host_part.txt 2>&1); local rc=$?; cat $OUT/host_part.txt >> $OUT/host.txt
  echo "host $dir exit $rc $((SECONDS-t)) s"; grep -hE "^(ar|medusa) " $OUT/host_part.txt; }
e2e() { local name=$1 dir=$2 t=$SECONDS  # the demo end to end, traced, from engine copy $dir -> $OUT/$name.json
  (cd $dir && PYTHONPATH=. timeout $(( $(left) - 5 )) python3 -m engine bench --part e2e \
    --prompts-file $ROOT/benchmarks/prompts/thirdparty_test.jsonl --prompts 12 --max-new-tokens 256 --no-stop-on-eos \
    --rounds 4 --traced --no-transformers --trees demo_tuned,mc_sim_7b_63 > $OUT/$name.json 2> $OUT/$name.err)
  echo "$name exit $? $((SECONDS-t)) s"; }
part=${1:-1}
if [ "$part" = 1 ]; then
  pytests _tail tail_tests.log 220 tests/test_kernels_gpu.py -m gpu_quick -k "skinny or split_k or tree_attention"
  ab _tail 7b_tail_auto_pdl 1 llama2-7b --gemm auto
  ab . 7b_auto_pdl 1 llama2-7b --gemm auto
  pytests . quick_tests.log 120 tests/test_kernels_gpu.py tests/test_graphs_gpu.py -m gpu_quick -k "resblock or traced or traces"
  host --every 16,32,64 --rounds 3
  ab _tail 7b_tail_skinny_pdl 1 llama2-7b --gemm skinny
elif [ "$part" = 2 ]; then
  pytests . ring_tests.log 150 tests/test_greedy_step_gpu.py tests/test_graphs_gpu.py \
    -k "ring or one_node or traced or traces or dependent_launch"
  for i in 1 2; do DIR=_before host --rounds 5; DIR=. host --rounds 5; done
  e2e e2e_traced .
elif [ "$part" = 3 ]; then
  for i in 1 2; do DIR=. host --rounds 5; DIR=_before host --rounds 5; done
  e2e e2e_traced_after .
  e2e e2e_traced_before _before
elif [ "$part" = 4 ]; then
  pytests . graph_tests.log 170 tests/test_graphs_gpu.py -m gpu_quick -k "traced or traces"
  host --rounds 5
  host --rounds 9 --max-new-tokens 256 --every 32 --profile
  e2e e2e_traced .
fi
echo "total $((SECONDS-t0)) s"
