"""The heap frozen after a command's load (engine/heap.py): garbage collected first, frozen cycles that
became garbage collected at the next freeze, and the collector's pauses counted only while asked."""

from __future__ import annotations

import argparse
import gc
import weakref

import pytest

from engine.heap import CollectorPauses, freeze_heap


class Node:
    pass


def cycle() -> Node:
    node = Node()
    node.self = node
    return node


@pytest.fixture
def no_automatic_collections():
    gc.disable()  # only the collections the test makes
    try:
        yield
    finally:
        gc.enable()


def test_freeze_heap_collects_garbage_before_freezing_and_frozen_garbage_at_the_next_freeze(no_automatic_collections):
    garbage = weakref.ref(cycle())
    assert garbage() is not None  # a cycle: only a collection frees it
    assert freeze_heap() > 0
    assert garbage() is None  # collected, not frozen for good

    node = cycle()
    kept = weakref.ref(node)
    freeze_heap()
    del node  # now garbage, but frozen: a plain collection leaves it (why letting an engine go freezes again)
    gc.collect()
    assert kept() is not None
    freeze_heap()
    assert kept() is None


def test_collector_pauses_counts_only_the_collections_made_while_active(no_automatic_collections):
    pauses = CollectorPauses()
    try:
        gc.collect()
        with pauses:
            gc.collect(0)
            gc.collect()
        gc.collect()
    finally:
        pauses.close()
    summary = pauses.summary()
    assert set(summary) == {"generation_0", "generation_2"}
    assert summary["generation_0"]["count"] == 1 and summary["generation_2"]["count"] == 1
    for gen in summary.values():  # durations, not clock readings
        assert 0 <= gen["longest_ms"] <= gen["total_ms"] < 1000
    assert pauses._on not in gc.callbacks
    pauses.close()  # twice is harmless


def test_the_commands_load_freezes_the_heap():
    from engine.options import add_model_arguments, load_from_arguments

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    assert gc.get_freeze_count() == 0  # conftest's thawed_heap: every test starts unfrozen
    load_from_arguments(p.parse_args(["--model", "demo", "--device", "cpu"]))
    assert gc.get_freeze_count() > 0
