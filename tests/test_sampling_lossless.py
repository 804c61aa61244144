"""Lossless tree sampling on a whole model: the first 3 tokens are distributed as the model says.

Vocabulary of 8 tokens, so the exact joint distribution of 3 tokens (512 outcomes) is computed by
enumeration; Medusa `sample` draws are tested against it by chi-square, and a deliberately biased
acceptance rule must fail the same test (the control that shows the test has power).
"""

import itertools

import pytest
import torch

import engine
import engine.accept as accept

V, N, PROMPT = 8, 2500, [1, 5, 2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import transformers
    from conftest import random_heads_sd

    d = tmp_path_factory.mktemp("v8")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    m.save_pretrained(str(d))
    return engine.load(d, heads=random_heads_sd(num_heads=3, dim=32, vocab=V), device="cpu")


def exact_joint(eng, temperature):
    m = eng.model
    probs = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=2):
            ids = torch.tensor([PROMPT + list(seq)])
            m.setup_cache(1, 16)
            logits = m.lm_head(m(ids, torch.arange(ids.shape[1])))[0].float() / temperature
            p = torch.softmax(logits, -1)
            for x3 in range(V):
                probs[seq + (x3,)] = float(p[len(PROMPT) - 1, seq[0]] * p[len(PROMPT), seq[1]] * p[len(PROMPT) + 1, x3])
    return probs


def chi_square(eng, probs, temperature):
    counts = dict.fromkeys(probs, 0)
    for i in range(N):
        out = eng.generate(PROMPT, 3, mode="medusa", tree=[[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]],
                           accept="sample", temperature=temperature, seed=i).token_ids
        counts[tuple(out)] += 1
    # merge outcomes with expected count < 5 into one bin
    big = [k for k in probs if probs[k] * N >= 5]
    obs = [counts[k] for k in big] + [sum(counts[k] for k in probs if k not in big)]
    exp = [probs[k] * N for k in big] + [sum(probs[k] for k in probs if k not in big) * N]
    pairs = [(o, e) for o, e in zip(obs, exp) if e > 0]
    stat = sum((o - e) ** 2 / e for o, e in pairs)
    dof = len(pairs) - 1
    # Wilson-Hilferty: the chi-square quantile at p = 0.001
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    return stat, crit


def test_sample_matches_the_model(tiny):
    probs = exact_joint(tiny, 1.0)
    stat, crit = chi_square(tiny, probs, 1.0)
    assert stat < crit, (stat, crit)


def test_biased_rule_fails_the_same_test(tiny, monkeypatch):
    def biased(buf, node_tokens, probs, gen):  # accepts every first child: not a draw from the target
        path = [0]
        children = {p: [i for i, q in enumerate(buf.parent.tolist()) if q == p] for p in range(buf.num_nodes)}
        while children[path[-1]]:
            path.append(children[path[-1]][0])
        return path, accept.sample(probs[path[-1]], gen)

    monkeypatch.setattr(accept, "verify_sample", biased)
    probs = exact_joint(tiny, 1.0)
    stat, crit = chi_square(tiny, probs, 1.0)
    assert stat > crit, (stat, crit)
