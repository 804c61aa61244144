"""Bad input everywhere: a clear error of a documented type, nothing lost, and the next request works."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import make_hf_model, random_heads_sd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import engine
import trees
from engine import GenerationError, ModelLoadError
from workbench.handlers import EDITOR, Workbench

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=40,
)


@pytest.fixture(scope="module")
def wb(demo_engine, tmp_path_factory):
    return Workbench(demo_engine, tmp_path_factory.mktemp("reliability"))


def good_run(wb) -> list[int]:
    events = list(wb.stream("def f(x):\n", "demo_tuned", "", "medusa", "greedy", 0.7, 12))
    return [t for s in events[-1]["traces"] for t in s["accepted_tokens"]]


@FUZZ
@given(value=json_values)
def test_any_json_as_a_tree_gives_a_verdict_never_an_exception(wb, value):
    msg, fig, _ = wb.validate_tree(json.dumps(value))
    assert msg.startswith(("✓", "✗"))
    assert (fig is None) == msg.startswith("✗")


@FUZZ
@given(text=st.text(max_size=200))
def test_any_text_as_a_tree_gives_a_verdict(wb, text):
    assert wb.validate_tree(text)[0].startswith(("✓", "✗"))


def test_truncated_deep_huge_and_out_of_range_trees(wb, tmp_path):
    f = tmp_path / "t.json"
    trees.save_tree(trees.TreeFile(trees.preset("mc_sim_7b_63"), num_heads=4, name="t"), f)
    text = f.read_text()
    for cut in range(1, len(text) - 1, 37):
        (tmp_path / "cut.json").write_text(text[:cut])
        with pytest.raises(trees.TreeError):
            trees.load_tree(tmp_path / "cut.json")
    deep = [[0] * d for d in range(1, 2000)]
    assert "exceeds the limit of 64" in wb.validate_tree(json.dumps(deep))[0]
    assert "exceeds the 4 heads" in wb.validate_tree(json.dumps(deep[:10]))[0]
    with pytest.raises(trees.TreeError, match="exceeds the limit of 64"):
        trees.validate(deep)
    with pytest.raises(trees.TreeError, match="more than 8192 paths"):
        trees.validate([[i] for i in range(10_000)], topk=10**6)
    wide = [[a, b] for a in range(10) for b in range(10)] + [[a] for a in range(10)]
    assert wb.validate_tree(json.dumps(wide))[0].startswith("✓")
    huge = [[a, b, c] for a in range(10) for b in range(10) for c in range(10)] + wide
    ev = list(wb.stream("x", EDITOR, json.dumps(huge), "medusa", "greedy", 0.7, 4))
    assert "at most 511" in ev[0]["error"]
    for bad, rule in (([[10]], "rank"), ([[-1]], "rank"), ([[0.5]], "integer"), ([["0"]], "integer"), ([[]], "empty"),
                      ([[0], [0]], "duplicate"), ({"medusa_choices": "[[0]]"}, "list")):
        msg = wb.validate_tree(json.dumps(bad))[0]
        assert msg.startswith("✗") and rule in msg.lower(), (bad, msg)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.one_of(st.text(max_size=300), st.sampled_from(["", " ", "\n\t\r", "\x00" * 40, "\u202e\u0301" * 30,
                                                                  "🙂" * 50, "a\x1b[2J" * 20])))
def test_any_prompt_decodes_or_says_why(wb, prompt):
    events = list(wb.stream(prompt, "demo_tuned", "", "medusa", "greedy", 0.7, 2))
    assert events and ("error" in events[0] or events[-1]["traces"])
    if "error" in events[0]:
        assert events[0]["error"] in ("the prompt is empty",) or "exceeds the context" in events[0]["error"]


def test_megabyte_prompt_is_refused_and_the_app_keeps_serving(wb, demo_engine):
    before = good_run(wb)
    ev = list(wb.stream("x" * 1_000_000, "demo_tuned", "", "medusa", "greedy", 0.7, 4))
    assert "limit is 20000" in ev[0]["error"]
    with pytest.raises(GenerationError, match="exceeds the context"):
        demo_engine.generate("def f():\n" * 100_000, 4)
    assert good_run(wb) == before


@FUZZ
@given(n=st.one_of(st.integers(-10**6, 10**6), st.just(0), st.floats(), st.booleans(), st.text(max_size=3)),
       temperature=st.one_of(st.floats(), st.just(0.0), st.just(-1.0)),
       top_k=st.integers(-5, 10**6), top_p=st.floats(-1, 2))
def test_any_generation_settings_run_or_raise_generation_error(demo_engine, n, temperature, top_k, top_p):
    try:
        res = demo_engine.generate("import os\n", n, mode="medusa", accept="sample", temperature=temperature,
                                   top_k=top_k, top_p=top_p, seed=0)
    except GenerationError as e:
        assert str(e)
    else:
        assert isinstance(n, int) and 1 <= n and res.new_tokens <= n


def test_simulated_out_of_memory_is_refused_and_serving_continues(wb, demo_engine):
    before = good_run(wb)
    with pytest.raises(GenerationError, match="out of memory: a KV cache for 300000 x"):
        demo_engine.generate(["x"] * 300_000, 4, mode="ar")
    assert good_run(wb) == before


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    make_hf_model(root / "ok", "llama")
    save_file(random_heads_sd(dim=32), str(root / "heads_dim32.safetensors"))
    save_file(random_heads_sd(vocab=50), str(root / "heads_vocab50.safetensors"))
    (root / "corrupt.safetensors").write_bytes(os.urandom(3000))
    import argparse

    torch.save({"0.0.linear.weight": torch.zeros(2, 2), "x": argparse.Namespace(a=1)}, root / "pickle.pt")
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / "notes.txt").write_text("hello")
    corrupt = root / "corrupt_model"
    make_hf_model(corrupt, "llama")
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 100)
    return root


CASES = [
    ({"model": "missing_dir"}, "no such model directory"),
    ({"model": "not_a_model"}, "no config.json"),
    ({"model": "corrupt_model"}, "cannot read weights"),
    ({"model": "ok", "heads": "heads_dim32.safetensors"}, "the base model needs"),
    ({"model": "ok", "heads": "heads_vocab50.safetensors"}, "the base model needs"),
    ({"model": "ok", "heads": "corrupt.safetensors"}, "cannot read weights"),
    ({"model": "ok", "heads": "pickle.pt"}, "cannot read weights"),
    ({"model": "ok", "heads": "nope.safetensors"}, "no such heads file"),
]


@pytest.mark.parametrize("case,msg", CASES, ids=[m for _, m in CASES])
def test_bad_model_and_head_files_raise_model_load_error(bad_models, case, msg):
    with pytest.raises(ModelLoadError, match=msg):
        engine.load(bad_models / case["model"], heads=bad_models / case["heads"] if "heads" in case else None, device="cpu")


@pytest.mark.parametrize("case,msg", CASES[:4] + CASES[6:7], ids=[m for _, m in CASES[:4] + CASES[6:7]])
def test_cli_exits_nonzero_with_one_readable_line(bad_models, case, msg):
    cmd = [sys.executable, "-m", "engine", "generate", "--model", str(bad_models / case["model"]), "--prompt-ids", "1,2",
           "--max-new-tokens", "4", "--device", "cpu"]
    if "heads" in case:
        cmd += ["--heads", str(bad_models / case["heads"])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], out.stderr


def test_cli_bad_settings_are_one_line(tmp_path):
    for extra, msg in ((["--max-new-tokens", "0"], "positive integer"), (["--tree", "[[3, 1]]"], "prefix [3] is missing"),
                       (["--tree", "[[3, 1"], "not valid JSON"),
                       (["--accept", "sample", "--temperature", "-1"], "temperature")):
        out = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", "x", "--device", "cpu", *extra],
                             capture_output=True, text=True, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and msg in lines[0], out.stderr


def test_a_killed_run_keeps_every_traced_step(tmp_path):
    f = tmp_path / "t.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "engine", "generate", "--prompt", "def main():\n", "--max-new-tokens",
                          "900", "--device", "cpu", "--trace", str(f)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (not f.exists() or f.read_text().count("\n") < 6):
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
    lines = f.read_text().splitlines()
    assert len(lines) >= 6 and p.returncode == -signal.SIGKILL
    rows = [json.loads(line) for line in lines]  # every line written is a whole step
    assert rows[0]["type"] == "header" and [r["step"] for r in rows[1:]] == list(range(len(rows) - 1))


def test_live_app_under_concurrency_cancel_and_faults():
    from workbench.loadtest import run

    out = run(sessions=20, sequential=10, tokens=8)
    assert out["concurrent"] == {**out["concurrent"], "completed": 20, "identical_to_single": 20}
    assert out["cancel"]["next_run_ok"]
    assert all(f["as_expected"] and f["next_good_run_unchanged"] for f in out["faults"]), out["faults"]
    assert out["sequential"]["mismatches"] == 0
    access = out["file_access"]  # only saved trees come back through the file route; uploads are bounded
    assert access["saved tree"] == 200 and access["upload 10 KB"] == 200 and access["upload 2 MB"] == 413, access
    assert all(code in (403, 404) for name, code in access.items() if name not in ("saved tree", "upload 10 KB",
                                                                                  "upload 2 MB")), access


def test_the_tune_log_is_bounded_and_keeps_the_newest_steps(demo_engine, tmp_path, monkeypatch):
    import workbench.handlers as handlers

    monkeypatch.setattr(handlers, "MAX_LOGGED_STEPS", 10)
    wb = handlers.Workbench(demo_engine, tmp_path)
    runs = [list(wb.stream(p, "demo_tuned", "", "medusa", "greedy", 0.7, 16))[-1]["traces"]
            for p in ("def f(x):\n", "import os\n", "class A:\n")]
    newest = [v for r in runs for v in trees.rank_vectors(r)][-10:]
    assert sum(len(r) for r in runs) > 10 and list(wb.rank_log) == newest
