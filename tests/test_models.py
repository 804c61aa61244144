"""The engine cache behind the model selector, and the benchmark prompt-set choices (no model loaded:
the cache takes any loader, and the prompt sets are files in a temporary cache folder)."""

import pytest

from engine import ModelLoadError
from workbench.models import Engines, model_choices
from workbench.prompt_sets import named_prompt_set
from workbench.session import UserError


def cache(limit=2):
    loads = []

    def loader(name):
        if name == "missing":
            raise ModelLoadError("the missing model is not here yet: run `python -m engine fetch missing` once")
        loads.append(name)
        return f"engine:{name}"

    return Engines(loader, limit), loads


def test_the_least_recently_used_idle_engine_is_evicted():
    c, loads = cache(2)
    c.get("a"), c.get("b"), c.get("a")
    c.get("c")  # full: b is the least recently used
    assert c.loaded() == ["a", "c"]
    c.get("b")
    assert loads == ["a", "b", "c", "b"]


def test_an_engine_in_use_by_a_job_is_never_evicted():
    c, _ = cache(2)
    with c.using("a"):
        c.get("b")
        c.get("c")  # a is older but busy: b goes
        assert "a" in c.loaded() and "b" not in c.loaded()
        with c.using("c"), pytest.raises(UserError, match="in use by a job"):
            c.get("d")  # every loaded engine is busy: refused, nothing evicted
        assert sorted(c.loaded()) == ["a", "c"]
    c.get("d")
    assert "d" in c.loaded()


def test_a_model_that_cannot_load_is_one_line_naming_the_fetch():
    c, _ = cache(1)
    with pytest.raises(UserError, match=r"python -m engine fetch missing"):
        c.get("missing")


def test_the_selector_offers_the_started_model_then_the_named_ones():
    assert model_choices("/some/folder") == ["/some/folder", "demo", "smollm2"]
    assert model_choices("smollm2") == ["smollm2", "demo"]


def test_prompt_sets_come_from_the_cache_or_name_the_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_WORKBENCH_CACHE", str(tmp_path))
    for name, target in (("mt-bench", "mtbench"), ("sharegpt", "sharegpt")):
        with pytest.raises(UserError, match=f"python -m engine fetch {target}`"):
            named_prompt_set(name)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mtbench.jsonl").write_text(
        '{"question_id": 81, "category": "writing", "turns": ["Write a blog post.", "Rewrite it."]}\n'
        '{"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]}\n')
    (tmp_path / "data" / "sharegpt_heldout.jsonl").write_text('{"prompt": "Hello there", "id": "c1:0"}\n')
    assert [p.text for p in named_prompt_set("mt-bench")] == ["Write a blog post.", "What is 2+2?"]
    assert [p.id for p in named_prompt_set("sharegpt")] == ["c1:0"]
    with pytest.raises(UserError, match="unknown prompt set"):
        named_prompt_set("alpaca")


def test_the_workbench_prompt_set_takes_the_fetched_sets(tmp_path, monkeypatch, demo_engine):
    from workbench.core import Workbench

    monkeypatch.setenv("MEDUSA_WORKBENCH_CACHE", str(tmp_path))
    wb = Workbench(demo_engine, tmp_path / "wb")
    with pytest.raises(UserError, match="fetch mtbench"):
        wb.prompt_set("mt-bench", "", None, 4)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mtbench.jsonl").write_text("".join(
        f'{{"question_id": {i}, "turns": ["q{i}"]}}\n' for i in range(10)))
    assert [p.text for p in wb.prompt_set("mt-bench", "", None, 3)] == ["q0", "q1", "q2"]


def test_choosing_a_model_without_heads_sets_ar_and_says_so(demo_engine, tmp_path):
    """As the CLI does: a model without heads decodes AR by default, its header says 'none: AR'; back
    on a model with heads, Medusa again."""
    from conftest import make_hf_model

    import engine
    from workbench.core import Workbench
    from workbench.modelbar import ModelBar
    from workbench.models import AR_ONLY
    from workbench.session import Session

    plain = tmp_path / "plain"
    make_hf_model(plain, "llama")
    wb = Workbench(demo_engine, tmp_path / "data", model="demo",
                   loader=lambda name: engine.load(plain if name == "plain" else name, device="cpu"))
    bar, session = ModelBar(wb), Session("s1")
    header, _, mode = bar.select(session, "plain")
    assert mode == "ar" and AR_ONLY in header and bar.on_load(session)[3] == "ar"
    header, _, mode = bar.select(session, "demo")
    assert mode == "medusa" and AR_ONLY not in header
