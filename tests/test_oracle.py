"""Oracle drafts on decisive random weights (engine/bench/oracle.py), as `bench --part e2e --shape`
runs them, on the CPU in bf16 at a tiny shape: the weights' greedy next token is the permutation's by a
margin that bf16 rounding cannot flip, so greedy Medusa equals AR and transformers, and the steps are
the oracle's; the heads that only cost time do not change a token."""

import pytest
import torch
from conftest import oracle_steps

import trees
from engine.bench.oracle import make_decisive, oracle_for, sampled_ranks
from engine.config import ModelArgs
from engine.engine import Engine
from engine.generation import GenerationConfig
from engine.heads import MedusaHeads
from engine.loading import build_model, fill_model

SHAPE = dict(vocab_size=4000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)


def tiny_pair(decisive: bool):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**SHAPE)
    hf = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    succ = make_decisive(hf) if decisive else None
    args = ModelArgs.from_hf_config({**cfg.to_dict(), "model_type": "llama"}, where="tiny")
    ours, _, _ = fill_model(build_model(args), hf.state_dict().items(), "cpu", torch.bfloat16, "tiny", share=True)
    return hf, ours, succ


@pytest.fixture(scope="module")
def decisive():
    return tiny_pair(True)


def test_decisive_weights_follow_their_permutation_by_a_wide_margin(decisive):
    hf, _, succ = decisive
    assert sorted(succ[100:].tolist()) == list(range(100, 4000)) and (succ[:100] == -1).all()
    ids = torch.randint(100, 4000, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = hf(ids).logits[0].float()
    top2 = logits.topk(2, dim=-1)
    assert top2.indices[:, 0].tolist() == succ[ids[0]].tolist()
    # half the winning logit: over a hundred of its bf16 rounding steps (2**-8 relative)
    assert ((top2.values[:, 0] - top2.values[:, 1]) / top2.values[:, 0]).min() > 0.5


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "chain_4"])
def test_oracle_on_decisive_weights_keeps_medusa_equal_to_ar_and_transformers_in_bf16(decisive, tree):
    hf, ours, succ = decisive
    eng = Engine(ours, None, None, "tiny", "oracle")
    prompts = [torch.randint(100, 4000, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 19)]
    cfg = GenerationConfig(max_new_tokens=48, mode="ar", stop_on_eos=False)
    ar = [eng.generate(p, config=cfg).token_ids for p in prompts]
    keys = [t for p, out in zip(prompts, ar) for t in [p[-1], *out]]
    assert len(set(keys)) == len(keys)  # the oracle finds a position by its token's hidden state: none twice
    for p, out in zip(prompts, ar):
        assert out == [succ[t].item() for t in [p[-1], *out[:-1]]]
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=48, do_sample=False, pad_token_id=0)
        assert ref[0, len(p):].tolist() == out

    def rank(s, k):  # a path that ends at every depth, off the first child at depth 2
        return [0, 1, 0, 2, -1][(s + k) % 5] if k else 0

    cost = MedusaHeads(4, 1, SHAPE["hidden_size"], SHAPE["vocab_size"]).to(torch.bfloat16)
    with torch.no_grad():
        for t in cost.parameters():
            t.normal_(0, 0.02)
    eng.heads = oracle_for(ours, [p + o for p, o in zip(prompts, ar)], [len(p) for p in prompts], 4,
                           lambda _, s, k: rank(s, k), cost=cost)
    for p, want in zip(prompts, ar):
        got = eng.generate(p, config=cfg.replace(mode="medusa", tree=tree))
        assert got.token_ids == want
        assert got.steps == oracle_steps(trees.resolve(tree), 48, 4, rank) < 48


def test_sampled_ranks_are_drawn_per_sequence_and_repeat():
    probs = [[0.5, 0.2]] * 2  # head k: top-1 half the time, second 20 %, else a miss
    draws = [[sampled_ranks(probs, seed=3)(i, p, k) for p in range(300) for k in range(2)] for i in (0, 1)]
    assert draws[0] != draws[1]  # two prompts do not accept the same lengths at the same steps
    assert draws[0] == [sampled_ranks(probs, seed=3)(0, p, k) for p in range(300) for k in range(2)]
    assert set(draws[0]) == {-1, 0, 1} and abs(draws[0].count(0) / 600 - 0.5) < 0.07


def test_decisive_refuses_tied_embeddings():
    import transformers

    hf = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**{**SHAPE, "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match="untied"):
        make_decisive(hf)
