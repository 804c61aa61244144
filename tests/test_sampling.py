"""The target's sampling distribution (temperature, then top-k, then top-p) against distributions
worked by hand, and the knobs reaching a real run: top_k = 1 or a tiny top_p sample exactly greedy."""

import math

import pytest
import torch

from engine.sampling import SamplingParams, target_probs

P = [0.05, 0.5, 0.15, 0.3]  # tokens in no particular order: sorted, 1 (.5), 3 (.3), 2 (.15), 0 (.05)
LOGITS = torch.tensor(P).log()


def probs_of(**kw) -> list[float]:
    return target_probs(LOGITS, SamplingParams(**{"temperature": 1.0, **kw})).tolist()


@pytest.mark.parametrize("top_p, want", [
    (0.3, [0, 1, 0, 0]),  # the most likely token alone reaches 0.3: it is kept, never dropped
    (0.6, [0, 0.5 / 0.8, 0, 0.3 / 0.8]),  # .5 < .6, .5 + .3 >= .6: the token that crosses p is kept
    (0.79, [0, 0.5 / 0.8, 0, 0.3 / 0.8]),
    (0.9, [0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95]),
    (1.0, P),
])
def test_top_p_keeps_the_fewest_most_likely_tokens_whose_mass_reaches_p(top_p, want):
    assert probs_of(top_p=top_p) == pytest.approx(want, abs=1e-6)


def test_top_p_stops_at_a_mass_exactly_equal_to_p():
    """Four equally likely tokens (0.25 each, exact in binary): two reach p = 0.5 exactly, so the third is
    not needed and is dropped."""
    probs = target_probs(torch.zeros(4), SamplingParams(1.0, top_p=0.5)).tolist()
    assert sorted(probs) == [0, 0, 0.5, 0.5]


@pytest.mark.parametrize("top_k, want", [(1, [0, 1, 0, 0]), (2, [0, 0.5 / 0.8, 0, 0.3 / 0.8]), (0, P), (4, P)])
def test_top_k_keeps_the_k_most_likely_tokens(top_k, want):
    assert probs_of(top_k=top_k) == pytest.approx(want, abs=1e-6)


def test_top_k_applies_before_top_p_and_temperature_before_both():
    # top-3 renormalised: .5/.95 = .526, .3/.95 = .316, .15/.95 = .158; top-p .82 then keeps two
    # (.526 + .316 = .842 >= .82). Top-p first would keep three (.5 + .3 = .8 < .82).
    assert probs_of(top_k=3, top_p=0.82) == pytest.approx([0, 0.5 / 0.8, 0, 0.3 / 0.8], abs=1e-6)
    hot = [math.sqrt(p) for p in P]  # T = 2: p^(1/2), renormalised
    assert probs_of(temperature=2.0) == pytest.approx([x / sum(hot) for x in hot], abs=1e-6)
    assert target_probs(LOGITS, SamplingParams()).tolist() == [0, 1, 0, 0]  # T = 0: greedy


@pytest.mark.parametrize("mode", ["ar", "medusa"])
def test_sampled_runs_with_a_one_token_nucleus_are_greedy(demo_engine, mode):
    """At T = 1.5 the model's own sampling differs from greedy within a few tokens; with top_k = 1 or a
    tiny top_p only the argmax is left, so each knob must reach the sampler for these to be equal."""
    prompt, n = "def read_config(path):", 16
    greedy = demo_engine.generate(prompt, n, mode="ar").token_ids
    hot = demo_engine.generate(prompt, n, mode=mode, accept="sample", temperature=1.5, seed=0).token_ids
    assert hot != greedy  # the control: without a knob, this sampled run is not greedy
    for knob in ({"top_k": 1}, {"top_p": 1e-6}):
        out = demo_engine.generate(prompt, n, mode=mode, accept="sample", temperature=1.5, seed=0, **knob)
        assert out.token_ids == greedy, knob
