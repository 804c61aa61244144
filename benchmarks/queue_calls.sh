#!/usr/bin/env bash
# The device calls of 2026-12-07, twenty-fourth session (benchmarks/README.md, "Two steps queued ahead"), as they ran.
# Output in $OUT. Engine copies made in the repo root first:
#   _before/  `mkdir _before && git archive b161e23 engine trees | tar -x -C _before` (the engine before this session)
#   _one/     (call 1) `mkdir _one && git archive 1fc4aa9 engine trees | tar -x -C _one` with graphs.STEPS_AHEAD set
#             to 1 (call 1's engine, `.`, queued two steps ahead; since then STEPS_AHEAD is 1)
#   bash benchmarks/queue_calls.sh 1   the graph tests of queued, traced and batched runs and the ring's kernel test;
#                                      the demo's traced and untraced runs (traced_host_profile.py --waits, 256
#                                      tokens, rounds in turn) from ., _one and _before; the demo end to end, traced,
#                                      from . and _before; the traced runs again in reverse order (as time allows)
#   bash benchmarks/queue_calls.sh 2   (STEPS_AHEAD 1) the same graph tests; the traced runs from . (with cProfile)
#                                      and _before; the demo end to end, traced, from . and _before; the traced runs
#                                      again (as time allows). Never ran: the machine was taken back, then none came.
#   bash benchmarks/queue_calls.sh 3   (STEPS_AHEAD 1) the graph tests of queued, traced and batched runs alone
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
ROOT=$PWD; t0=$SECONDS; LIMIT=${LIMIT:-560}
left() { echo $((LIMIT-SECONDS+t0)); }
for d in _before _one; do [ -d $d ] && { [ -e $d/models ] || ln -s ../models $d/models; }; done
pytests() { local log=$1 limit=$2; shift 2; local t=$SECONDS
  timeout $limit python3 -m pytest -p no:cacheprovider -o addopts="" -q -rfE --tb=short "$@" > $OUT/$log 2>&1
  echo "tests $log exit $? $((SECONDS-t)) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$log | tail -8; }
host() { local dir=$1 t=$SECONDS; shift
  [ $(left) -lt 50 ] && { echo "host $dir skipped"; return; }
  echo "== $dir $*" >> $OUT/host.txt
  (cd $dir && PYTHONPATH=. timeout $(( $(left) < 90 ? $(left) - 5 : 90 )) python3 $ROOT/benchmarks/traced_host_profile.py \
    demo "$@" > $OUT/host_part.txt 2>&1); local rc=$?; cat $OUT/host_part.txt >> $OUT/host.txt
  echo "host $dir exit $rc $((SECONDS-t)) s"; grep -hE "^(ar|medusa) " $OUT/host_part.txt; }
e2e() { local name=$1 dir=$2 t=$SECONDS
  [ $(left) -lt 60 ] && { echo "$name skipped"; return; }
  (cd $dir && PYTHONPATH=. timeout $(( $(left) - 5 )) python3 -m engine bench --part e2e \
    --prompts-file $ROOT/benchmarks/prompts/thirdparty_test.jsonl --prompts 12 --max-new-tokens 256 --no-stop-on-eos \
    --rounds 4 --traced --no-transformers --trees demo_tuned,mc_sim_7b_63 > $OUT/$name.json 2> $OUT/$name.err)
  echo "$name exit $? $((SECONDS-t)) s"; }
part=${1:-1}
if [ "$part" = 1 ]; then
  pytests queue_tests.log 170 tests/test_graphs_gpu.py tests/test_greedy_step_gpu.py \
    -k "queued or leaving or traced or traces or heads_passes or ring"
  for d in . _one _before; do host $d --rounds 5 --max-new-tokens 256 --waits; done
  e2e e2e_traced .
  e2e e2e_traced_before _before
  for d in _before _one .; do host $d --rounds 5 --max-new-tokens 256 --waits; done
elif [ "$part" = 2 ]; then
  pytests queue_tests_2.log 170 tests/test_graphs_gpu.py tests/test_greedy_step_gpu.py \
    -k "queued or leaving or traced or traces or heads_passes or ring"
  host . --rounds 5 --max-new-tokens 256 --waits --profile
  host _before --rounds 5 --max-new-tokens 256 --waits
  e2e e2e_traced_2 .
  e2e e2e_traced_before_2 _before
  for d in _before .; do host $d --rounds 5 --max-new-tokens 256 --waits; done
elif [ "$part" = 3 ]; then
  pytests queue_tests_3.log $(( $(left) - 5 )) tests/test_graphs_gpu.py -k "queued or leaving or traced or traces or heads_passes"
fi
echo "total $((SECONDS-t0)) s"
