#!/usr/bin/env bash
# The device calls of 2026-12-07, twenty-fifth session (benchmarks/README.md, "Where a step's host time goes").
# Output in $OUT. Call 1 ran host_breakdown.py before it had its `setup` part and `--calls`; `.` was 45b4ab6 in call 1,
# adccd21 in call 2, 04e0de1 in calls 3 and 4.
#   bash benchmarks/host_calls.sh 1   the graph tests of queued, traced and batched runs (one step queued, as landed
#                                     at 45b4ab6); where the host's time goes in each variant (host_breakdown.py);
#                                     traced against untraced (traced_host_profile.py --waits)
#   bash benchmarks/host_calls.sh 2   host_breakdown.py with the run's fixed cost, and the CUDA calls inside a launch;
#                                     the kernels tracing adds (traced_kernels.py), from . and from _before/ (45b4ab6:
#                                     `mkdir _before && git archive 45b4ab6 engine trees | tar -x -C _before`); the
#                                     trace kernel's tests; traced against untraced from each, in turn
#   bash benchmarks/host_calls.sh 3   (a tree's buffers kept per engine, events recorded on a kept stream object) the
#                                     graph tests of traced, queued and batched runs; host_breakdown.py --calls;
#                                     traced against untraced from . and _before/ in turn; the demo end to end, traced,
#                                     from each (2 rounds)
#   bash benchmarks/host_calls.sh 4   the demo end to end, traced, 4 rounds: from ., _before/, . again
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
lscpu | grep -E "^Model name|^CPU\(s\)|MHz" | head -4
ROOT=$PWD; t0=$SECONDS; LIMIT=${LIMIT:-570}
left() { echo $((LIMIT-SECONDS+t0)); }
for d in _before; do [ -d $d ] && { [ -e $d/models ] || ln -s ../models $d/models; }; done
pytests() { local log=$1 limit=$2; shift 2; local t=$SECONDS
  timeout $limit python3 -m pytest -p no:cacheprovider -o addopts="" -q -rfE --tb=short "$@" > $OUT/$log 2>&1
  echo "tests $log exit $? $((SECONDS-t)) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/$log | tail -8; }
bench() { local name=$1 dir=$2 t=$SECONDS; shift 2
  [ $(left) -lt 40 ] && { echo "$name skipped"; return; }
  (cd $dir && PYTHONPATH=. timeout $(( $(left) < 120 ? $(left) - 5 : 120 )) python3 "$@" > $OUT/$name.part 2>&1)
  echo "$name exit $? $((SECONDS-t)) s"; cat $OUT/$name.part >> $OUT/$name.txt; grep -hE "^(ar|medusa) |variant|perf_counter|Error" $OUT/$name.part | cut -c1-900; }
e2e() { local name=$1 dir=$2 t=$SECONDS
  [ $(left) -lt 60 ] && { echo "$name skipped"; return; }
  (cd $dir && PYTHONPATH=. timeout $(( $(left) - 5 )) python3 -m engine bench --part e2e \
    --prompts-file $ROOT/benchmarks/prompts/thirdparty_test.jsonl --prompts 12 --max-new-tokens 256 --no-stop-on-eos \
    --rounds ${ROUNDS:-2} --traced --no-transformers --trees demo_tuned,mc_sim_7b_63 > $OUT/$name.json 2> $OUT/$name.err)
  echo "$name exit $? $((SECONDS-t)) s"; }
part=${1:-1}
if [ "$part" = 1 ]; then
  bench breakdown . $ROOT/benchmarks/host_breakdown.py demo --rounds 3 --max-new-tokens 256
  bench traced . $ROOT/benchmarks/traced_host_profile.py demo --rounds 5 --max-new-tokens 256 --waits
  pytests queue_tests_3.log $(( $(left) - 60 )) tests/test_graphs_gpu.py -k "queued or leaving or traced or traces or heads_passes"
  bench breakdown . $ROOT/benchmarks/host_breakdown.py demo --rounds 3 --max-new-tokens 256
elif [ "$part" = 2 ]; then
  bench breakdown . $ROOT/benchmarks/host_breakdown.py demo --rounds 3 --max-new-tokens 256 --calls
  bench kernels . $ROOT/benchmarks/traced_kernels.py demo --max-new-tokens 256
  bench kernels_before _before $ROOT/benchmarks/traced_kernels.py demo --max-new-tokens 256
  pytests trace_kernel_tests.log 150 tests/test_greedy_step_gpu.py tests/test_graphs_gpu.py \
    -k "traced_fused_ar or ar_trace_fields or one_node or ring or trace_fields or traced or traces"
  for d in . _before _before .; do bench traced_$([ $d = . ] && echo now || echo before) $d $ROOT/benchmarks/traced_host_profile.py demo --rounds 5 --max-new-tokens 256 --waits; done
elif [ "$part" = 3 ]; then
  pytests graph_tests.log 170 tests/test_graphs_gpu.py tests/test_greedy_step_gpu.py \
    -k "traced_fused_ar or one_node or ring or traced or traces or queued or leaving or heads_passes or per_span or per_heads"
  bench breakdown . $ROOT/benchmarks/host_breakdown.py demo --rounds 3 --max-new-tokens 256 --calls
  for d in . _before _before .; do bench traced_$([ $d = . ] && echo now || echo before) $d $ROOT/benchmarks/traced_host_profile.py demo --rounds 5 --max-new-tokens 256 --waits; done
  e2e e2e_now .
  e2e e2e_before _before
elif [ "$part" = 4 ]; then
  ROUNDS=4 e2e e2e_now_4 .
  ROUNDS=4 e2e e2e_before_4 _before
  ROUNDS=4 e2e e2e_now_4b .
fi
echo "total $((SECONDS-t0)) s"
