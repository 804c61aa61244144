"""`python -m engine bench` on the CPU with the demo model: the JSON says what ran, counts what it
should, and its correctness fields are true where they must be (greedy fp32 Medusa == AR ==
transformers). No timing is asserted."""

import json
import subprocess
import sys

import pytest
import torch

from engine.bench.common import round_robin, warm_up

pytestmark = pytest.mark.slow


def bench(*args: str) -> dict:
    """One thread, like every torch process of the suite (conftest: OMP_NUM_THREADS)."""
    out = subprocess.run([sys.executable, "-m", "engine", "bench", "--device", "cpu", "--threads", "1", *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_e2e_json_counts_every_round_and_greedy_outputs_agree():
    res = bench("--part", "e2e", "--prompts", "3", "--max-new-tokens", "12", "--no-stop-on-eos", "--rounds", "2",
                "--trees", "chain_2,kary_2x2", "--traced")
    assert res["ar"]["tokens"] == 3 * 12 * 2 and len(res["ar"]["round_tokens_per_s"]) == 2
    assert res["transformers"]["greedy_output_equals_ours_ar"] is True
    for name in ("chain_2", "kary_2x2"):
        row = res["medusa"][name]
        assert row["tokens"] == 72 and row["greedy_output_equals_ar"] is True
        assert row["agreement_with_ar"] == {"identical": 3, "of": 3, "first_divergence_at": []}
        assert 1 < row["tokens_per_step"] <= 3 and row["speedup_vs_ar"]["n"] == 2
    assert set(res["traced"]) == {"ar", "ar without heads", "medusa:chain_2", "medusa:kary_2x2"}
    assert all(t["same_output"] for t in res["traced"].values())


def test_latency_json_has_every_size_and_a_choice_among_them():
    from engine.loading import DEMO_DIR

    res = bench("--part", "latency", "--prompts", "2", "--max-new-tokens", "12", "--no-stop-on-eos", "--rounds", "2",
                "--sizes", "2,4", "--traces", str(DEMO_DIR / "tune_traces.jsonl"))
    assert [p["nodes"] for p in res["points"]] == [0, 2, 4] and res["points"][0]["tokens_per_step"] == 1
    assert [len(res["trees"][n]) for n in ("2", "4")] == [2, 4]
    choice = res["size_choice"]
    assert choice["chosen"] in (0, 2, 4) and choice["runner_up"] in {0, 2, 4} - {choice["chosen"]}
    assert isinstance(choice["chosen_is_fastest_or_within_ci"], bool)


def test_batch_sweep_runs_named_trees_or_one_tree_per_size_at_every_batch():
    named = bench("--part", "batch", "--prompts", "2", "--max-new-tokens", "8", "--no-stop-on-eos",
                  "--batches", "1,3", "--trees", "chain_2,kary_2x2")
    assert list(named["trees"]) == ["chain_2", "kary_2x2"] and [r["batch"] for r in named["rows"]] == [1, 3]
    for row in named["rows"]:  # 2 prompts: batch 1 runs both in turn, batch 3 each three times in two batches of 3
        assert row["ar"]["requests"] == {1: 2, 3: 6}[row["batch"]] and set(row["medusa"]) == {"chain_2", "kary_2x2"}
        assert row["ar"]["tokens"] == 8 * row["ar"]["requests"] and row["ar"]["steps"] == 8 * 2
        assert all(m["greedy_output_equals_ar"] for m in row["medusa"].values())  # fp32: lossless at any batch
        assert row["best_nodes"] == {"chain_2": 2, "kary_2x2": 6}[row["best_tree"]]
    sized = bench("--part", "batch", "--prompts", "2", "--max-new-tokens", "8", "--no-stop-on-eos",
                  "--batches", "2", "--sizes", "2,3")
    assert [len(t) for t in sized["trees"].values()] == [2, 3] and set(sized["rows"][0]["medusa"]) == {"2", "3"}


def test_shape_runs_with_oracle_drafts_take_exactly_the_oracles_steps():
    """`--shape demo` on the CPU: decisive random weights, oracle drafts drawn per prompt and four
    costed heads. Medusa must equal AR and transformers, and its steps must be exactly what the drawn
    ranks allow (conftest.oracle_steps), prompt by prompt; the batch sweep runs the same engine."""
    from conftest import oracle_steps

    import trees
    from engine.bench.oracle import sampled_ranks
    from engine.loading import DEMO_DIR

    max_new, names = 12, ["chain_2", "mc_sim_7b_63"]
    res = bench("--part", "e2e", "--shape", "demo", "--prompts", "2", "--prompt-len", "16", "--max-new-tokens",
                str(max_new), "--rounds", "1", "--trees", ",".join(names))
    assert res["device"] == "cpu" and res["oracle_positions_distinct"] is True
    assert res["transformers"]["greedy_output_equals_ours_ar"] is True
    demo = trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl"))
    rank = sampled_ranks(trees.head_stats([v for r in demo for v in r.vectors], 4, topk=10).accuracy())
    for name in names:
        row = res["medusa"][name]
        assert row["greedy_output_equals_ar"] is True
        want = [oracle_steps(trees.resolve(name), max_new, 4, lambda s, k, i=i: rank(i, s, k)) for i in range(2)]
        assert row["steps"] == sum(want), (name, row["steps"], want)
    sweep = bench("--part", "batch", "--shape", "demo", "--prompts", "2", "--prompt-len", "16", "--max-new-tokens",
                  str(max_new), "--batches", "1,2", "--trees", "mc_sim_7b_63")
    assert all(r["medusa"]["mc_sim_7b_63"]["greedy_output_equals_ar"] for r in sweep["rows"])


def test_warm_up_runs_the_longest_prompt_first_then_the_shortest():
    seen = []
    warm_up({"a": lambda p: seen.append(("a", p)), "b": lambda p: seen.append(("b", p))}, [[1, 2], [1, 2, 3, 4], [5]])
    assert seen == [("a", [1, 2, 3, 4]), ("b", [1, 2, 3, 4]), ("a", [5]), ("b", [5])]


def test_round_robin_interleaves_modes_within_each_prompt():
    order = []

    def runner(name):
        def run(p):
            order.append((name, p))
            return [p] * 3, 2
        return run

    res = round_robin({"x": runner("x"), "y": runner("y")}, [1, 2], rounds=2)
    assert order == [("x", 1), ("y", 1), ("x", 2), ("y", 2)] * 2
    assert res["x"]["tokens"] == 12 and res["x"]["steps"] == 8 and res["x"]["outputs"] == [[1] * 3, [2] * 3]


def test_round_robin_counts_the_collections_inside_each_runners_timed_runs():
    """A full collection stalls the host for a fifth of a second in a process whose heap is not frozen:
    the bench says which runner's timed runs it fell in, and only theirs."""
    import gc

    def collects(p):
        gc.collect()
        return [p], 1

    callbacks = len(gc.callbacks)
    gc.disable()  # no collection but the runner's own
    try:
        gc.collect()  # outside any timed run: counted nowhere
        res = round_robin({"collects": collects, "quiet": lambda p: ([p], 1)}, [1, 2], rounds=2)
    finally:
        gc.enable()
    assert res["collects"]["gc"]["generation_2"]["count"] == 4
    assert res["quiet"]["gc"] == {}
    assert len(gc.callbacks) == callbacks  # its listeners are gone

    def fails(p):
        raise RuntimeError("a runner failed")

    with pytest.raises(RuntimeError):
        round_robin({"fails": fails}, [1], rounds=1)
    assert len(gc.callbacks) == callbacks  # gone too when a runner raises


def test_a_medusa_output_that_leaves_ar_is_judged_at_its_first_difference(tmp_path):
    """bf16 divergences of greedy Medusa from AR are judged by a float32 transformers run: here the
    'Medusa' output takes a token the float32 model ranks below AR's, so the judge must place the
    difference at that position, prefer AR's token and not call it a near-tie (the margin is large)."""
    from conftest import make_hf_model

    import engine
    from engine.bench.e2e import judge_medusa_divergences

    hf = make_hf_model(tmp_path / "m")
    eng = engine.load(str(tmp_path / "m"), heads=False, device="cpu", dtype="float32")
    prompts = [[5, 9, 14, 3], [7, 7, 21]]
    ar = [eng.generate(p, 8, mode="ar", stop_on_eos=False).token_ids for p in prompts]
    with torch.inference_mode():
        logits = hf(torch.tensor([prompts[1] + ar[1][:3]])).logits
    worst = int(logits[0, -1].argmin())  # the float32 model's least likely token after AR's first 3
    bent = ar[1][:3] + [worst] + ar[1][4:]
    res = {"ar": {"outputs": ar}, "medusa:same": {"outputs": ar}, "medusa:bent": {"outputs": [ar[0], bent]}}
    out = {"medusa": {"same": {}, "bent": {}}}
    judge_medusa_divergences(eng, prompts, res, ["same", "bent"], out)
    same, bent_row = out["medusa"]["same"]["divergences_vs_ar"], out["medusa"]["bent"]["divergences_vs_ar"]
    assert same["identical"] == 2 and same["per_prompt"] == []
    assert bent_row["identical"] == 1 and bent_row["divergences_not_near_tie"] == 1
    (row,) = bent_row["per_prompt"]
    assert row["prompt"] == 1 and row["first_difference"] == 3
    assert (row["ours"], row["theirs"], row["fp32_prefers"], row["near_tie"]) == (worst, ar[1][3], "theirs", False)
