#!/usr/bin/env bash
# The held-out tree experiment of benchmarks/README.md (demo model, CPU, greedy): AR traces of the
# tune and test prompt sets, trees optimised on the tune traces, Medusa runs of every tree on the
# test prompts (measured tokens/step), and `trees experiment` comparing every estimator with them.
#   bash benchmarks/tree_experiment.sh [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
N=${1:-96}
D=benchmarks/tree_experiment
P=benchmarks/prompts
mkdir -p $D/work
rm -f $D/work/*.jsonl
for set in tune test; do
  $PY -m engine collect-traces --prompts-file $P/thirdparty_$set.jsonl --max-new-tokens $N --device cpu --out $D/work/ar_$set.jsonl
done
for n in 12 64; do
  $PY -m trees optimize --traces $D/work/ar_tune.jsonl --nodes $n --method replay --folds 5 --name opt_replay_$n --out $D/opt_replay_$n.json --overwrite
done
for m in position independent; do
  $PY -m trees optimize --traces $D/work/ar_tune.jsonl --nodes 64 --method $m --name opt_${m}_64 --out $D/opt_${m}_64.json --overwrite
done
specs=()
for t in $D/demo_tuned_2026-12-03.json chain_4 mc_sim_7b_63 $D/opt_replay_12.json $D/opt_replay_64.json $D/opt_position_64.json $D/opt_independent_64.json; do
  name=$(basename "$t" .json)
  $PY -m engine collect-traces --prompts-file $P/thirdparty_test.jsonl --max-new-tokens $N --device cpu --mode medusa --tree "$t" --out $D/work/medusa_$name.jsonl
  specs+=(--tree "$t:$D/work/medusa_$name.jsonl")
done
$PY -m trees experiment --traces-tune $D/work/ar_tune.jsonl --traces-test $D/work/ar_test.jsonl "${specs[@]}" > $D/experiment.json
echo "wrote $D/experiment.json"
# typical and sample acceptance: the step-start estimator from Medusa-run traces of mc_sim_7b_63 on the
# tune prompts, against measured runs of its subtrees on the test prompts (same rule, temperature, seed)
for rule in typical sample; do
  $PY -m engine collect-traces --prompts-file $P/thirdparty_tune.jsonl --max-new-tokens $N --device cpu --mode medusa \
      --tree mc_sim_7b_63 --accept $rule --temperature 0.7 --seed 0 --out $D/work/${rule}_tune_mc_sim.jsonl
  specs=()
  for t in chain_4 kary_2x2 kary_3x2 mc_sim_7b_63; do
    $PY -m engine collect-traces --prompts-file $P/thirdparty_test.jsonl --max-new-tokens $N --device cpu --mode medusa \
        --tree $t --accept $rule --temperature 0.7 --seed 0 --out $D/work/${rule}_$t.jsonl
    specs+=(--tree "$t:$D/work/${rule}_$t.jsonl")
  done
  $PY -m trees experiment --medusa-tune $D/work/${rule}_tune_mc_sim.jsonl "${specs[@]}" > $D/experiment_$rule.json
  echo "wrote $D/experiment_$rule.json"
done
# the shipped default tree: the 12-node replay optimum over the stdlib held-out traces and the tune set
$PY -m trees optimize --traces models/demo/tune_traces.jsonl $D/work/ar_tune.jsonl --nodes 12 --folds 5 \
    --name demo_tuned --out trees/data/demo_tuned.json --overwrite
