#!/usr/bin/env bash
# The recorded H200 runs (benchmarks/README.md). Each part fits one device call (10 minutes):
#   bash benchmarks/gpu_run.sh A   GPU tests, attention kernel, demo end to end (128 and 960 tokens), latency + size choice
#   bash benchmarks/gpu_run.sh B   one step at 7B/8B shapes, 7B-shape end to end with oracle drafts (bf16)
#   bash benchmarks/gpu_run.sh 1   one step at 7B/8B shapes; 7B-shape end to end with oracle drafts in float32
#   bash benchmarks/gpu_run.sh 2   (FA4 installed, FLASH_ATTN_SITE set: fa4_install.sh) every GPU test, attention with FA4
#   bash benchmarks/gpu_run.sh 3   demo end to end, triton and flash_attn; one 7B step with flash_attn
#   bash benchmarks/gpu_run.sh shapes        7B-shape end to end and batch sweep (oracle drafts, bf16), one step at 7B and
#                                            at the small shapes (about 8 minutes on an H100)
#   bash benchmarks/gpu_run.sh quick         the gpu_quick tests: one case per kernel path, graphs on the demo
#   bash benchmarks/gpu_run.sh attention     the full tree-attention grid against its reference (90 cases)
#   bash benchmarks/gpu_run.sh kernels       every other kernel test (compaction, RoPE, norms, skinny GEMM, the greedy
#                                            step's fused kernels, engine)
#   bash benchmarks/gpu_run.sh graphs        graph, FlashAttention-4 and compaction-stress tests
# (the whole GPU test set no longer fits one call: on 2026-12-05, 141 kernel tests ran in 240 s of one)
# JSON goes to $OUT (the device tool's output folder) or ./gpu_out.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
P=benchmarks/prompts/thirdparty_test.jsonl
run() { local name=$1; shift; local t0=$SECONDS; "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; echo "$name: exit $? in $((SECONDS - t0)) s"; }
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv,noheader
part=${1:-A}
tests() { local name=$1; shift; local t0=$SECONDS
  timeout 540 python3 -m pytest "$@" -p no:cacheprovider -o addopts="" -q -rs --durations=10 > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s"; tail -3 "$OUT/$name.log"; }
if [ "$part" = quick ]; then
  tests gpu_quick tests/test_kernels_gpu.py tests/test_greedy_step_gpu.py tests/test_graphs_gpu.py tests/test_flash4_gpu.py \
      tests/test_compact_stress_gpu.py -m gpu_quick
elif [ "$part" = shapes ]; then
  run gpu_e2e_llama2_7b python3 -m engine bench --part e2e --shape llama2-7b --prompts 4 --max-new-tokens 256 \
      --no-stop-on-eos --rounds 2 --trees demo_tuned,mc_sim_7b_63
  run gpu_batch_llama2_7b python3 -m engine bench --part batch --shape llama2-7b --prompts 4 --max-new-tokens 128 \
      --batches 1,2,4,8,16,32 --trees demo_tuned,mc_sim_7b_63
  run gpu_step_llama2_7b python3 -m engine bench --part step --shapes llama2-7b
  run gpu_step_demo_smollm2 python3 -m engine bench --part step --shapes demo,smollm2-135m --prefix 256
elif [ "$part" = attention ]; then
  tests gpu_attention_tests tests/test_kernels_gpu.py -k tree_attention_matches_reference
elif [ "$part" = kernels ]; then
  tests gpu_kernel_tests tests/test_kernels_gpu.py tests/test_greedy_step_gpu.py -k "not tree_attention_matches_reference"
elif [ "$part" = graphs ]; then
  tests gpu_graph_tests tests/test_graphs_gpu.py tests/test_flash4_gpu.py tests/test_compact_stress_gpu.py
elif [ "$part" = 1 ]; then
  run gpu_step python3 -m engine bench --part step
  run gpu_e2e_llama2_7b_fp32 python3 -m engine bench --part e2e --shape llama2-7b --dtype float32 --prompts 4 \
      --max-new-tokens 256 --no-stop-on-eos --rounds 1 --trees demo_tuned,mc_sim_7b_63
elif [ "$part" = 2 ]; then
  timeout 420 python3 -m pytest tests/test_kernels_gpu.py tests/test_graphs_gpu.py tests/test_flash4_gpu.py \
      -p no:cacheprovider -o addopts="" -q -rs 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
  run gpu_attention timeout 170 python3 -m engine bench --part attention --markdown
elif [ "$part" = 3 ]; then
  for b in triton flash_attn; do
    run demo_gpu_e2e_128_$b python3 -m engine bench --part e2e --prompts-file $P --prompts 12 --max-new-tokens 128 \
        --no-stop-on-eos --rounds 2 --traced --no-transformers --backend $b
  done
  run gpu_step_flash_attn python3 -m engine bench --part step --shapes llama2-7b --backend flash_attn
elif [ "$part" = A ]; then
  python3 -m pytest tests/test_kernels_gpu.py tests/test_graphs_gpu.py -p no:cacheprovider -o addopts="" -q 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -4
  run gpu_attention python3 -m engine bench --part attention --markdown
  run demo_gpu_e2e_128 python3 -m engine bench --part e2e --prompts-file $P --prompts 12 --max-new-tokens 128 \
      --no-stop-on-eos --rounds 3 --traced
  run demo_gpu_e2e_960 python3 -m engine bench --part e2e --prompts-file $P --prompts 12 --max-new-tokens 960 \
      --no-stop-on-eos --rounds 2 --no-transformers
  python3 -m engine collect-traces --prompts-file $P --prompts 12 --max-new-tokens 128 --no-stop-on-eos \
      --out "$OUT/gpu_tune_traces.jsonl" > /dev/null
  run demo_gpu_latency python3 -m engine bench --part latency --prompts-file $P --prompts 12 --max-new-tokens 128 \
      --no-stop-on-eos --traces "$OUT/gpu_tune_traces.jsonl" --sizes 2,4,8,12,16,24,32,48,64 --rounds 3
  rm -f "$OUT/gpu_tune_traces.jsonl"
else
  python3 -m pytest tests/test_graphs_gpu.py -p no:cacheprovider -o addopts="" -q 2>&1 | tail -3
  run gpu_step python3 -m engine bench --part step
  run gpu_e2e_llama2_7b python3 -m engine bench --part e2e --shape llama2-7b --prompts 4 --max-new-tokens 256 \
      --no-stop-on-eos --rounds 2 --trees demo_tuned,mc_sim_7b_63
  run demo_gpu_e2e_128_ours python3 -m engine bench --part e2e --prompts-file $P --prompts 12 --max-new-tokens 128 \
      --no-stop-on-eos --rounds 2 --no-transformers --trees mc_sim_7b_63
  run demo_gpu_e2e_128_fp32 python3 -m engine bench --part e2e --prompts-file $P --prompts 12 --max-new-tokens 128 \
      --no-stop-on-eos --rounds 1 --no-transformers --dtype float32 --trees demo_tuned,mc_sim_7b_63
  run gpu_e2e_llama2_7b_skinny python3 -m engine bench --part e2e --shape llama2-7b --prompts 4 --max-new-tokens 256 \
      --no-stop-on-eos --rounds 2 --trees demo_tuned,mc_sim_7b_63 --gemm skinny
fi
