"""The engine cache behind the model selector, and the benchmark prompt-set choices (no model loaded:
the cache takes any loader, and the prompt sets are files in a temporary cache folder)."""

import weakref

import pytest
import torch

from engine import ModelLoadError
from engine.loading import NAMED_MODELS
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


class SimulatedMemory:
    """A device of `total` bytes where the engine of a model holds `held[model]` (its real size) and
    the cache is told it needs `need[model]` (the estimate; by default the same)."""

    def __init__(self, total: int, held: dict[str, int], need: dict[str, int] | None = None,
                 claims: dict[str, int] | None = None):
        self.total, self.sizes, self.needs, self.cache = total, held, need or held, None
        self.claims = claims or held  # what `held` says an engine holds (a wrong count where they differ)

    def need(self, name):
        return self.needs[name]

    def free(self):
        return self.total - sum(self.sizes[n] for n in self.cache.loaded())

    def held(self, engine):
        return self.claims[engine.removeprefix("engine:")]


def memory_cache(total: int, held: dict[str, int], need: dict[str, int] | None = None, limit: int = 4,
                 claims: dict[str, int] | None = None):
    memory = SimulatedMemory(total, held, need, claims)
    memory.cache = Engines(lambda name: f"engine:{name}", limit, memory)
    return memory.cache


def test_a_model_that_does_not_fit_evicts_idle_engines_until_it_does():
    c = memory_cache(10, {"a": 4, "b": 4, "c": 1, "mid": 5, "big": 7})
    c.get("a"), c.get("b"), c.get("c"), c.get("a")  # 9 of 10 used; least recently used first: b, c, a
    c.get("mid")  # needs 5 with 1 free: b goes, which is enough
    assert c.loaded() == ["c", "a", "mid"]
    c.get("big")  # needs 7 with 0 free: c (1), then a (4), then mid (5) go
    assert c.loaded() == ["big"]


def test_a_model_that_cannot_fit_is_refused_in_one_line_and_nothing_is_evicted():
    c = memory_cache(10, {"a": 4, "b": 4, "mid": 7, "huge": 12}, limit=2)
    c.get("a"), c.get("b")  # the cache is full too: a refused model must not cost it an engine
    with pytest.raises(UserError, match=r"^'huge' needs about [\d.]+ [GM]iB for its weights and [\d.]+ [GM]iB is free: close"):
        c.get("huge")  # more than the whole device
    assert c.loaded() == ["a", "b"]
    with c.using("a"):
        with pytest.raises(UserError, match="is free; 1 loaded model is in use by a job"):
            c.get("mid")  # 2 free + idle b's 4 < 7, since a is busy: refused before b is evicted
        assert sorted(c.loaded()) == ["a", "b"]


def test_what_an_engine_frees_is_what_it_holds_not_the_estimate():
    # a holds 2 of 10 though a file-based estimate would say 4: 8 free + 2 < 11, refused up front
    c = memory_cache(10, {"a": 2, "new": 11}, need={"a": 4, "new": 11})
    c.get("a")
    with pytest.raises(UserError, match="'new' needs"):
        c.get("new")
    assert c.loaded() == ["a"]


def test_an_engine_that_freed_less_than_it_seemed_to_hold_ends_in_the_same_refusal():
    c = memory_cache(10, {"a": 2, "new": 11}, claims={"a": 4, "new": 11})  # a seems to hold 4, frees 2
    c.get("a")
    with pytest.raises(UserError, match=r"'new' needs about 0\.0 MiB for its weights and 0\.0 MiB is free"):
        c.get("new")  # 8 free + 4 seemed enough: a went, 10 free is not


def test_free_memory_on_the_cpu_is_the_smaller_of_the_kernels_and_the_cgroups(monkeypatch, tmp_path):
    from engine import engine as engine_module

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemAvailable: 100 kB\n")
    real_path = engine_module.Path
    monkeypatch.setattr(engine_module, "Path", lambda p: real_path(meminfo) if p == "/proc/meminfo" else real_path(p))
    monkeypatch.setattr(engine_module, "cgroup_room", lambda: 60 * 1024)
    assert engine_module.available_memory() == 60 * 1024
    monkeypatch.setattr(engine_module, "cgroup_room", lambda: None)
    assert engine_module.available_memory() == 100 * 1024


def test_a_models_need_is_its_weights_at_the_apps_dtype(tmp_path):
    from safetensors.torch import save_file

    from workbench.models import DeviceMemory

    (tmp_path / "config.json").write_text("{}")
    save_file({"w": torch.zeros(10, 30, dtype=torch.bfloat16), "b": torch.zeros(30, dtype=torch.bfloat16)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "optimizer.pt").write_bytes(bytes(8000))  # not a weight file the loader reads
    save_file({"heads.0.weight": torch.zeros(4, 5, dtype=torch.float16)}, str(tmp_path / "medusa_heads.safetensors"))
    assert DeviceMemory(lambda: None, 4).need(str(tmp_path)) == (300 + 30 + 20) * 4  # float32: 4 bytes an element
    assert DeviceMemory(lambda: None, 2).need(str(tmp_path)) == (300 + 30 + 20) * 2
    assert DeviceMemory(lambda: None, 2).need(str(tmp_path / "nope")) is None  # the loader names what is missing
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    assert DeviceMemory(lambda: None, 2).need(str(tmp_path)) is None
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(bytes(4000))  # pickled: counted as half precision
    assert DeviceMemory(lambda: None, 4).need(str(tmp_path)) == 8000 + 20 * 4


def test_the_demo_needs_what_its_engine_holds(demo_engine):
    """On the real demo: the weights' need at float32 is what the loaded engine's weights hold, and
    what the engine holds is those plus its KV cache, counted once."""
    from workbench.models import DeviceMemory

    demo_engine.generate("x = 1", 2)  # it has a KV cache
    weights = sum(p.numel() * p.element_size() for p in demo_engine.model.parameters())
    heads = sum(p.numel() * p.element_size() for p in demo_engine.heads.parameters())
    assert DeviceMemory(demo_engine.free_memory, 4).need("demo") == weights + heads
    cache = demo_engine.model.cache
    kv = cache.k.numel() * cache.k.element_size() * 2
    assert weights + heads + kv <= demo_engine.held_memory() <= weights + heads + kv + 4096  # + rope tables
    assert demo_engine.free_memory() > 0


def test_the_app_refuses_a_model_that_does_not_fit_its_free_memory(demo_engine, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from workbench import core, models
    from workbench.core import Workbench

    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1000, 1000)}, str(big / "model.safetensors"))
    loads = []
    monkeypatch.setattr(core, "device_free_memory", lambda device: 1_000_000)  # 4 MB of float32 weights need more
    wb = Workbench(demo_engine, tmp_path / "wb", loader=lambda name: loads.append(name) or demo_engine)
    monkeypatch.setattr(models.DeviceMemory, "held", staticmethod(lambda engine: 0))
    with pytest.raises(UserError, match=f"'{big}' needs about 3.8 MiB for its weights and 1.0 MiB is free"):
        wb.engines.get(str(big))
    assert loads == []


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

    plain = tmp_path / "plain"  # the app was started on it, so the selector offers it
    make_hf_model(plain, "llama")
    wb = Workbench(engine.load(plain, device="cpu"), tmp_path / "data", model=str(plain),
                   loader=lambda name: demo_engine if name == "demo" else engine.load(name, device="cpu"))
    bar, session = ModelBar(wb), Session("s1")
    header, _, mode = bar.select(session, str(plain))
    assert mode == "ar" and AR_ONLY in header and bar.on_load(session)[3] == "ar"
    header, _, mode = bar.select(session, "demo")
    assert mode == "medusa" and AR_ONLY not in header


def test_the_api_decodes_with_the_model_it_names(demo_engine, tmp_path):
    """An API client never sees the page's model selector: /generate's `model` picks a model the app
    offers, and the client stays on it; a name the app does not offer is one line naming the choices."""
    from conftest import tabs_of

    import engine
    from engine.loading import DEMO_DIR
    from workbench.core import Workbench
    from workbench.session import Session

    plain = tmp_path / "plain"  # the demo's base model without its heads: the app starts on it
    plain.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (plain / f).symlink_to(DEMO_DIR / f)
    wb = Workbench(engine.load(plain, device="cpu"), tmp_path / "data", model=str(plain),
                   loader=lambda name: demo_engine if name == "demo" else engine.load(name, device="cpu"))
    api, session, prompt = tabs_of(wb).api, Session("api-client"), "def read_config(path):"
    assert "error" in api.generate(session, prompt, "demo_tuned", "medusa", max_new_tokens=16)  # no heads to draft
    out = api.generate(session, prompt, "demo_tuned", "medusa", max_new_tokens=16, model="demo")
    assert out["token_ids"] == demo_engine.generate(prompt, 16, mode="medusa", tree="demo_tuned").token_ids
    assert out["mean_accepted"] > 1 and wb.store.load_run(out["run_id"])[0]["settings"]["model"] == "demo"
    assert api.generate(session, prompt, "demo_tuned", "medusa", max_new_tokens=16)["token_ids"] == out["token_ids"]
    assert api.generate(session, prompt, model="gpt-5") == {
        "error": f"unknown model 'gpt-5': this app offers {plain}, demo, smollm2"}
    assert wb.model_of(session) == "demo"  # a refused name leaves the client on its model


@pytest.mark.skipif(not (NAMED_MODELS["smollm2"].base_dir / "config.json").exists(),
                    reason="SmolLM2 is not imported here: `python -m engine fetch smollm2`")
def test_the_api_decodes_with_smollm2_when_it_is_here(demo_engine, tmp_path):
    from conftest import tabs_of

    import engine
    from workbench.core import Workbench
    from workbench.session import Session

    wb = Workbench(demo_engine, tmp_path / "data", model="demo", loader=lambda name: engine.load(name, device="cpu"))
    out = tabs_of(wb).api.generate(Session("api-client"), "Name a colour.", mode="ar", max_new_tokens=8,
                                   model="smollm2")
    assert out["token_ids"] == wb.engines.get("smollm2").generate("Name a colour.", 8, mode="ar").token_ids
    assert wb.store.load_run(out["run_id"])[0]["settings"]["model"] == "smollm2"


class CyclicEngine(str):
    """An engine stand-in that is a reference cycle, as a real engine's objects may be: only a
    collection frees it."""

    def __new__(cls, name: str):
        engine = super().__new__(cls, name)
        engine.me = engine
        return engine


def test_engines_let_go_are_collected_though_the_heap_is_frozen():
    """The app freezes the heap after each load (engine/heap.py), which leaves frozen cycles to the next
    freeze: the cache collects an engine it lets go at once, for room and for memory alike."""
    from engine.heap import freeze_heap

    alive = {}

    def loader(name):
        engine = CyclicEngine(f"engine:{name}")
        alive[name] = weakref.ref(engine)
        return engine

    for_room = Engines(loader, limit=1)
    for_room.get("a")
    freeze_heap()  # as the app's load of "a" did
    for_room.get("b")  # no room for two: a goes
    assert alive["a"]() is None

    memory = SimulatedMemory(10, {"c": 6, "d": 6})
    memory.cache = for_memory = Engines(loader, limit=4, memory=memory)
    for_memory.get("c")
    freeze_heap()
    for_memory.get("d")  # 4 free, 6 needed: c goes
    assert alive["c"]() is None


def test_the_started_engine_is_freed_once_the_cache_lets_it_go(tmp_path):
    """Nothing but the cache holds the engine the app started with (its free-memory query is the
    device's, not a method of the engine), so a model switch past the cache's limit returns its memory."""
    import engine as engine_api
    from workbench.core import Workbench

    started = engine_api.load("demo", device="cpu")
    ref = weakref.ref(started)
    wb = Workbench(started, tmp_path / "wb", loader=lambda name: f"engine:{name}", model="demo", max_engines=1)
    del started
    wb.engines.get("other")  # one engine at a time: the demo goes
    assert ref() is None
