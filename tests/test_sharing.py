"""One Engine shared: runs are serialised (Engine docstring). Interleaved streams of one thread get a
clear EngineBusy, never each other's cache; threads sharing an engine each get their solo output."""

import threading

import pytest

import engine
from engine import EngineBusy

PROMPTS = ["def read_config(path):", "import os\n", "class Stack:\n", "for i in range(10):"]
SETTINGS = dict(mode="medusa", tree="mc_sim_7b_63")


@pytest.fixture(scope="module")
def solo(demo_engine):
    return {p: demo_engine.generate(p, 48, **SETTINGS).token_ids for p in PROMPTS}


def tokens_of(events) -> list[int]:
    return [t for ev in events for t in ev.tokens]


def test_interleaved_streams_in_one_thread_are_refused_not_mixed(demo_engine, solo):
    a = demo_engine.stream(PROMPTS[0], 48, **SETTINGS)
    first = [next(a), next(a)]
    with pytest.raises(EngineBusy, match="open stream"):
        demo_engine.stream(PROMPTS[1], 48, **SETTINGS)
    with pytest.raises(EngineBusy):
        demo_engine.generate(PROMPTS[1], 48, **SETTINGS)
    with pytest.raises(EngineBusy):  # the bulk path sets up its own cache too: it waits its turn like the rest
        demo_engine.greedy_continuations([demo_engine.encode(PROMPTS[1])], 4)
    assert tokens_of(first + list(a)) == solo[PROMPTS[0]]  # the open stream was not disturbed
    b = demo_engine.stream(PROMPTS[1], 48, **SETTINGS)  # exhausted: the engine is free again
    assert tokens_of(b) == solo[PROMPTS[1]]


def test_closed_or_dropped_streams_give_the_engine_back(demo_engine, solo):
    s = demo_engine.stream(PROMPTS[2], 48, **SETTINGS)
    next(s)
    s.close()
    never_started = demo_engine.stream(PROMPTS[2], 48, **SETTINGS)
    del never_started  # a generator that never ran would keep it forever
    for i, _ in enumerate(demo_engine.stream(PROMPTS[2], 48, **SETTINGS)):
        if i == 2:
            break
    assert demo_engine.generate(PROMPTS[2], 48, **SETTINGS).token_ids == solo[PROMPTS[2]]


def test_bad_settings_do_not_keep_the_engine(demo_engine, solo):
    with pytest.raises(engine.GenerationError):
        demo_engine.stream(PROMPTS[0], 48, tree=[[0, 1]])
    assert tokens_of(demo_engine.stream(PROMPTS[0], 48, **SETTINGS)) == solo[PROMPTS[0]]


def test_threads_sharing_an_engine_each_get_their_solo_output(demo_engine, solo):
    """Threaded generate() calls and streams consumed from other threads, all at once."""
    out: dict[tuple, list[int]] = {}
    errors = []

    def call(p, i):
        try:
            if i % 2:
                out[(p, i)] = tokens_of(demo_engine.stream(p, 48, **SETTINGS))
            else:
                out[(p, i)] = demo_engine.generate(p, 48, **SETTINGS).token_ids
        except Exception as e:  # reported below: a thread's exception would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=call, args=(p, i)) for i in range(3) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(out) == 3 * len(PROMPTS)
    assert all(tokens == solo[p] for (p, _), tokens in out.items())


def test_a_stream_may_be_advanced_from_several_threads(demo_engine, solo):
    """Gradio steps a generator from whichever worker thread is free: the engine stays held."""
    s = demo_engine.stream(PROMPTS[3], 48, **SETTINGS)
    got = []
    for _ in range(4):
        t = threading.Thread(target=lambda: got.extend(next(s).tokens))
        t.start()
        t.join(60)
    assert got + tokens_of(s) == solo[PROMPTS[3]]
