"""Batched decoding: every request's output equals its batch-of-one output and plain AR (greedy)."""

import pytest
import torch
from conftest import VOCAB, make_hf_model, oracle_heads, oracle_steps, random_heads_sd

import engine
import engine.engine
import trees
from engine.decode import ar_forward, tree_forward
from engine.head_trace import HeadTrace
from engine.prompts import heldout_prompts
from engine.session import EagerRunner, Session, root_params


@pytest.fixture(scope="module", params=[("llama", 4), ("llama", 1), ("qwen2", 2)], ids=["mha", "gqa4", "qwen2"])
def eng(request, tmp_path_factory):
    kind, n_kv = request.param
    d = tmp_path_factory.mktemp(f"batch-{kind}-{n_kv}")
    make_hf_model(d, kind, n_kv=n_kv)
    return engine.load(d, heads=random_heads_sd(), device="cpu", dtype="float32")


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("mode,tree", [("ar", None), ("medusa", "mc_sim_7b_63"), ("medusa", "chain_3")])
def test_batch_equals_batch_of_one_and_ar(eng, mode, tree):
    batch = prompts([5, 13, 2, 9])
    singles = [eng.generate(p, 30, mode=mode, tree=tree) for p in batch]
    together = eng.generate(batch, 30, mode=mode, tree=tree)
    ar = [eng.generate(p, 30, mode="ar").token_ids for p in batch]
    assert [r.token_ids for r in together] == [r.token_ids for r in singles] == ar
    assert [r.steps for r in together] == [r.steps for r in singles]


def test_batch_with_oracle_drafts_accepts_long_paths_per_request(eng):
    """Requests at different lengths accept different long paths through non-first children in one
    step; each row compacts its own K/V and every output is AR's."""
    batch = prompts([5, 13, 2, 9], seed=6)
    rank = lambda p, k: (p + k) % 3  # noqa: E731
    saved, eng.heads = eng.heads, oracle_heads(eng, batch, 30, 5, rank)
    try:
        ar = [eng.generate(p, 30, mode="ar").token_ids for p in batch]
        together = eng.generate(batch, 30, mode="medusa", tree="mc_sim_7b_63")
    finally:
        eng.heads = saved
    assert [r.token_ids for r in together] == ar
    want = oracle_steps(trees.preset("mc_sim_7b_63"), 30, 5, rank)
    assert [r.steps for r in together] == [want] * 4 and want < 15


def test_requests_that_stop_at_different_steps_leave_the_batch(eng):
    batch = prompts([7, 3, 11], seed=4)
    free = [eng.generate(p, 40, mode="ar").token_ids for p in batch]
    # EOS = tokens that first appear at different depths of different requests' outputs
    eng.eos_ids = {free[0][4], free[2][20]}
    try:
        singles = [eng.generate(p, 40, mode="medusa", tree="mc_sim_7b_63") for p in batch]
        together = eng.generate(batch, 40, mode="medusa", tree="mc_sim_7b_63")
        ar = eng.generate(batch, 40, mode="ar")
    finally:
        eng.eos_ids = set()
    assert [r.token_ids for r in together] == [r.token_ids for r in singles] == [r.token_ids for r in ar]
    lengths = {len(r.token_ids) for r in together}
    assert len(lengths) > 1 and any(r.finish_reason == "eos" for r in together)


class QueuedEagerRunner(EagerRunner):
    """The eager runner queued the way GraphRunner is, `queue` steps beyond the one the session reads:
    a launch runs its step at once from the device state the launch before it left, while the host's
    lengths lag by the steps not yet read, so the span a step reads (sdpa reads every slot it is given)
    must come from the session's `ahead`, as a graph's does."""

    def __init__(self, *args, queue: int):
        super().__init__(*args)
        self.ahead = queue

    def launch(self, state, ahead: int = 0):
        nodes = self.buf.num_nodes if self.buf is not None else 1
        span = min(max(state.host_lengths) + ahead + nodes, self.model.cache.capacity)
        if self.buf is not None:
            return tree_forward(self.model, self.heads, self.buf, state, self.rule, self.params, self.gen, span=span,
                                trace=bool(self.trace_topk))
        return ar_forward(self.model, state, root_params(self.rule, self.params), self.gen, span=span,
                          trace_topk=self.trace_topk)


@pytest.mark.parametrize("queue", [1, 2, 3])
@pytest.mark.parametrize("mode,tree", [("ar", None), ("medusa", "mc_sim_7b_63")])
def test_steps_queued_ahead_of_the_read_decode_as_steps_read_in_turn(eng, monkeypatch, mode, tree, queue):
    """engine/session.py queues up to `runner.ahead` steps before it reads one (graphs.STEPS_AHEAD): requests
    that end at EOS or at the token limit while later steps are queued drop those steps' rows, the batch
    shrinks only once nothing is queued, and every step's tokens, prefix and trace are those of a run
    that reads each step before launching the next."""
    batch = prompts([7, 3, 11, 5], seed=4)
    free = [eng.generate(p, 33, mode="ar").token_ids for p in batch]
    eng.eos_ids = {free[0][4], free[2][20]}
    try:
        want = eng.generate(batch, 33, mode=mode, tree=tree, trace=True, trace_heads=False)
        monkeypatch.setattr(engine.engine, "EagerRunner", lambda *a: QueuedEagerRunner(*a, queue=queue))
        got = eng.generate(batch, 33, mode=mode, tree=tree, trace=True, trace_heads=False)
    finally:
        eng.eos_ids = set()
    assert len({len(r.token_ids) for r in got}) > 1 and "eos" in {r.finish_reason for r in got}
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert_same_traces(got, want)


@pytest.mark.parametrize("queue", [2, 3])
def test_steps_queued_ahead_stop_at_the_token_limit_of_a_full_cache(tmp_path, monkeypatch, queue):
    """A queued step may run only if every step before it leaves its requests short of their limit: near
    the end of the cache a step past the limit would write K/V past it."""
    make_hf_model(tmp_path, "llama", n_kv=2, ctx=64)
    e = engine.load(tmp_path, heads=random_heads_sd(), device="cpu")
    batch = prompts([30, 4, 50])
    want = [r.token_ids for r in e.generate(batch, 14, mode="ar")]
    monkeypatch.setattr(engine.engine, "EagerRunner", lambda *a: QueuedEagerRunner(*a, queue=queue))
    assert [r.token_ids for r in e.generate(batch, 14, mode="ar")] == want
    assert [r.token_ids for r in e.generate(batch, 14, mode="medusa", tree="mc_sim_7b_63")] == want


def assert_same_traces(got, want, heads: bool = False) -> None:
    """Each run's trace lines are the other's, step times aside; a step may run in a larger batch or over a
    longer span, so probabilities may round to the next millionth (with `heads`, every line has head_topk)."""
    for a, b in zip(got, want):
        assert len(a.traces) == len(b.traces) == a.steps
        for ta, tb in zip(a.traces, b.traces):
            del ta["step_ms"], tb["step_ms"]
            assert (not heads or "head_topk" in ta) and close(ta, tb), (ta["request"], ta["step"])


def close(a, b) -> bool:
    """Equal, floats to within 1.5 millionths."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1.5e-6
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == b


def test_batch_near_the_cache_limit(tmp_path):
    make_hf_model(tmp_path, "llama", n_kv=2, ctx=64)
    e = engine.load(tmp_path, heads=random_heads_sd(), device="cpu")
    batch = prompts([30, 4, 50])
    singles = [e.generate(p, 14, mode="medusa", tree="mc_sim_7b_63").token_ids for p in batch]
    assert [r.token_ids for r in e.generate(batch, 14, mode="medusa", tree="mc_sim_7b_63")] == singles
    with pytest.raises(engine.GenerationError, match="prompt 2 of 50 tokens"):
        e.generate(batch, 15, mode="ar")


def test_batch_sampling_at_zero_temperature_is_greedy_and_traces_name_the_request(eng):
    batch = prompts([6, 10], seed=2)
    greedy = [r.token_ids for r in eng.generate(batch, 20, mode="ar")]
    sampled = eng.generate(batch, 20, mode="medusa", accept="sample", temperature=0.0, trace=True)
    assert [r.token_ids for r in sampled] == greedy
    assert {t["request"] for t in sampled[1].traces} == {1}
    typical = eng.generate(batch, 20, mode="medusa", accept="typical", temperature=0.7, seed=1)
    assert all(r.new_tokens == 20 for r in typical)


def test_demo_batch_accepts_long_paths_and_matches_single(demo_engine):
    batch = heldout_prompts(4)
    singles = [demo_engine.generate(p, 48, mode="medusa", tree="demo_tuned") for p in batch]
    together = demo_engine.generate(batch, 48, mode="medusa", tree="demo_tuned")
    ar = [demo_engine.generate(p, 48, mode="ar").token_ids for p in batch]
    assert [r.token_ids for r in together] == [r.token_ids for r in singles] == ar
    assert sum(r.new_tokens for r in together) / sum(r.steps for r in together) > 1.6


@pytest.mark.parametrize("queue", [1, 2, 3])
@pytest.mark.parametrize("mode,tree", [("ar", None), ("medusa", "mc_sim_7b_63")])
def test_queued_steps_never_launch_past_the_token_limit(eng, monkeypatch, mode, tree, queue):
    """Without EOS a request ends only at its token limit, which `_may_end` sees coming: a queued run
    launches no step the sequential run does not, and no launch starts a request's row further into
    the cache than the sequential run's last step did (a step past the limit writes K/V past it)."""
    batch = prompts([7, 3, 11, 5], seed=4)
    launched = []
    real = Session._launch

    def recording(self, state, rows, step, ahead=0):
        launched.append({req: state.lengths[i].item() - len(batch[req]) for i, req in enumerate(rows)})
        return real(self, state, rows, step, ahead)

    monkeypatch.setattr(Session, "_launch", recording)
    want = eng.generate(batch, 17, mode=mode, tree=tree)
    seq = list(launched)
    launched.clear()
    monkeypatch.setattr(engine.engine, "EagerRunner", lambda *a: QueuedEagerRunner(*a, queue=queue))
    got = eng.generate(batch, 17, mode=mode, tree=tree)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert len(launched) == len(seq) == max(r.steps for r in got)
    for req in range(len(batch)):
        assert max(at[req] for at in launched if req in at) == max(at[req] for at in seq if req in at), req


@pytest.mark.parametrize("queue", [1, 2])
@pytest.mark.parametrize("every", [1, 3])
def test_queued_traced_ar_steps_get_the_heads_of_the_step_before(eng, monkeypatch, every, queue):
    """The session's heads trace (engine/head_trace.py) with steps queued as on CUDA graphs, its ring sized
    for them: requests end (EOS, limit) while steps are queued, passes fall between queued steps, and
    every trace line, head_topk included, is the sequential run's."""
    batch = prompts([7, 3, 11, 5], seed=4)
    free = [eng.generate(p, 23, mode="ar").token_ids for p in batch]
    eng.eos_ids = {free[0][4], free[2][14]}
    try:
        # the engine sizes the ring from its runner's queue (`ahead`)
        monkeypatch.setattr(engine.engine, "HeadTrace", lambda heads, w, topk, _every, b, _graphs, ahead:
                            HeadTrace(heads, w, topk, every, b, ahead=ahead))
        want = eng.generate(batch, 23, mode="ar", trace=True)
        monkeypatch.setattr(engine.engine, "EagerRunner", lambda *a: QueuedEagerRunner(*a, queue=queue))
        got = eng.generate(batch, 23, mode="ar", trace=True)
    finally:
        eng.eos_ids = set()
    assert "eos" in {r.finish_reason for r in got}
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert_same_traces(got, want, heads=True)
