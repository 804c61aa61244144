#!/usr/bin/env bash
# The device calls of 2026-12-07, twenty-first session (benchmarks/README.md, "A traced step's host time; the 7B
# AR step with our GEMM and PDL"), as they ran. Output in $OUT.
#   bash benchmarks/host_trace_ab.sh 1   GPU tests (graphs, tree attention, ResBlock tail, fused tree step), the
#                                        small shapes' steps, traced host time and the demo's traced end to end,
#                                        before (a copy of 1aa900f's engine in _before/, made in the repo root first:
#                                        `mkdir _before && git archive 1aa900f engine trees | tar -x -C _before`)
#                                        and after
#   bash benchmarks/host_trace_ab.sh 2   the 7B-shape AR and 64-node steps: cuBLAS and our GEMM, PDL off and on, and
#                                        our GEMM with a weight prefetch before PDL's wait (a copy of the engine in
#                                        _pf/ with benchmarks/patches/gemv_prefetch.diff applied: MEDUSA_PREFETCH
#                                        weight columns per program; not in the engine)
#   bash benchmarks/host_trace_ab.sh 3   part 1's tests again, failures printed, and the traced host time
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
ROOT=$PWD; t0=$SECONDS; LIMIT=${LIMIT:-560}
left() { echo $((LIMIT-SECONDS+t0)); }
BENCH=$ROOT/benchmarks/step_ab.py
[ -d _before ] && { [ -e _before/models ] || ln -s ../models _before/models; }
tests() {
  timeout 150 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rfE --tb=short tests/test_graphs_gpu.py \
    tests/test_kernels_gpu.py tests/test_greedy_step_gpu.py -m gpu_quick \
    -k "graphed or traced or queued or dependent_launch or tree_attention or resblock or fused_tree_steps" > $OUT/tests.log 2>&1
  echo "tests exit $? $((SECONDS-t0)) s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -5
}
host() {  # traced_host_profile.py from _before/ and from the checkout, alternating
  for v in before after before after; do
    [ $(left) -lt 25 ] && break
    d=.; [ $v = before ] && d=_before
    (cd $d && PYTHONPATH=. timeout $(( $(left) < 40 ? $(left) : 40 )) python3 $ROOT/benchmarks/traced_host_profile.py demo) > /tmp/host.txt 2>&1
    echo "host $v exit $? $((SECONDS-t0)) s"; grep -hE "^(ar|medusa) " /tmp/host.txt; (echo "## $v"; cat /tmp/host.txt) >> $OUT/host.txt
  done
}
part=${1:-1}
if [ "$part" = 1 ]; then
  tests
  (PYTHONPATH=. timeout 120 python3 $BENCH --label now --no-attention --shapes demo,smollm2-135m --sizes 63,64) >> $OUT/ab.jsonl 2>> $OUT/ab.err
  echo "ab exit $? $((SECONDS-t0)) s"
  host
  for v in after before; do
    [ $(left) -lt 70 ] && break
    d=.; [ $v = before ] && d=_before
    (cd $d && PYTHONPATH=. timeout 90 python3 -m engine bench --part e2e --prompts-file $ROOT/benchmarks/prompts/thirdparty_test.jsonl \
       --prompts 12 --max-new-tokens 256 --no-stop-on-eos --rounds 3 --traced --no-transformers \
       --trees demo_tuned,mc_sim_7b_63) > $OUT/e2e_$v.json 2> $OUT/e2e_$v.err
    echo "e2e $v exit $? $((SECONDS-t0)) s"
  done
elif [ "$part" = 2 ]; then
  [ -d _pf ] || { mkdir _pf && git archive HEAD engine trees | tar -x -C _pf && (cd _pf && patch -p1 < $ROOT/benchmarks/patches/gemv_prefetch.diff); }
  ab() { local dir=$1 label=$2 pdl=$3 pf=$4; shift 4; local t=$SECONDS
    [ $(left) -lt 75 ] && { echo "$label skipped"; return; }
    (cd $dir && MEDUSA_PREFETCH=$pf MEDUSA_WORKBENCH_PDL=$pdl PYTHONPATH=. timeout $(( $(left) < 140 ? $(left) - 5 : 140 )) \
      python3 $BENCH --label $label --no-attention --shapes llama2-7b --sizes 64 "$@") >> $OUT/ab7b.jsonl 2>> $OUT/ab7b.err
    echo "$label exit $? $((SECONDS-t)) s"; }
  ab _pf skinny_pdl 1 0 --gemm skinny
  ab _pf skinny_pdl_pf512 1 512 --gemm skinny
  ab . cublas 0 0 --gemm cublas
  ab _pf skinny_pdl_pf2048 1 2048 --gemm skinny
  ab . cublas_pdl 1 0 --gemm cublas
  ab _pf auto_pdl_pf512 1 512 --gemm auto
elif [ "$part" = 3 ]; then
  tests
  grep -B2 -A25 "^___" $OUT/tests.log | head -90
  python3 - <<'PY'
import torch
from engine.kernels import pointwise as pw
for dt in (torch.float32, torch.bfloat16, torch.float16):
    y = torch.randn(4, 3, 384, device="cuda").to(dt); r = torch.randn(4, 3, 384, device="cuda").to(dt)
    got, want = pw.residual_silu(r, y), pw.residual_silu_reference(r, y)
    print("residual_silu", dt, "fraction differing", (got != want).float().mean().item(), "max abs", (got.float() - want.float()).abs().max().item())
PY
  host
fi
echo "total $((SECONDS-t0)) s"
