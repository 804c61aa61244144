"""The shipped demo model: loads everywhere, decodes losslessly, and the trainer works."""

import json
import subprocess
import sys

import pytest
import torch

import engine
import trees
from engine.loading import DEMO_DIR
from engine.prompts import heldout_prompts


def test_shipped_files_and_size():
    names = {p.name for p in DEMO_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "medusa_heads.safetensors", "README.md"} <= names
    shipped = sum((DEMO_DIR / n).stat().st_size for n in ("model.safetensors", "tokenizer.json", "medusa_heads.safetensors"))
    assert shipped <= 24_000_000


def test_transformers_loads_it_and_agrees(demo_engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(DEMO_DIR), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR))
    ids = tok.encode("def parse(self, text):\n")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, len(ids):]
    assert demo_engine.generate(ids, 32, mode="ar").token_ids == ref.tolist()


def test_tokenizer_round_trip(demo_engine):
    text = "    for key, value in sorted(d.items()):\n        print(f'{key}={value!r}')  # ünïcode\n"
    assert demo_engine.tokenizer.decode(demo_engine.tokenizer.encode(text)) == text


@pytest.mark.parametrize("tree", ["demo_tuned", "mc_sim_7b_63", "chain_4", "kary_3x3"])
def test_medusa_equals_ar_and_accepts(demo_engine, tree):
    for p in heldout_prompts(2):
        ar = demo_engine.generate(p, 48, mode="ar")
        md = demo_engine.generate(p, 48, mode="medusa", tree=tree)
        assert md.token_ids == ar.token_ids
        assert md.mean_accepted > 1.6  # real heads: the tree pays on held-out code (2.0-4.0 measured here)


def test_default_tree_is_the_tuned_one():
    assert trees.DEFAULT_TREE == "demo_tuned" and trees.resolve(None) == trees.preset("demo_tuned")


def test_cli_generate_json():
    out = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", "demo", "--prompt", "import os\n",
                          "--max-new-tokens", "16", "--json"], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    assert set(res) >= {"text", "token_ids", "new_tokens", "steps", "mean_accepted", "wall_s", "tokens_per_s", "mode", "tree"}
    assert res["new_tokens"] == 16 and res["mode"] == "medusa"


def test_cli_error_is_one_line():
    out = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", "demo", "--prompt", "x",
                          "--tree", "[[0, 1]]"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error:") and len(out.stderr.strip().splitlines()) == 1


def test_train_base_with_future_heads_saves_a_loadable_model(tmp_path):
    """The base trainer's auxiliary future-token loss runs, is reported, and what it saves loads."""
    import numpy as np

    from engine.train.base import train_base

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", 20_000), ("heldout.bin", 4_000)):
        rng.integers(1, 8192, size=n, dtype=np.uint16).tofile(data / name)
    rep = train_base(data, tmp_path / "m", steps=4, batch=2, seq=64, future_heads=2, device="cpu", log=lambda *_: None)
    assert rep["future_heads"] == 2 and rep["history"] and "train_future_loss" in rep["history"][-1]
    eng = engine.load(tmp_path / "m", heads=False, device="cpu")
    assert len(eng.generate([5, 6, 7], 4, mode="ar").token_ids) == 4


def test_eval_heads_cli_on_real_held_out_text(tmp_path):
    """`eval-heads` scores the shipped heads on text they never saw: far above chance (1/8192)."""
    text = tmp_path / "heldout.py"
    text.write_text("\n".join(heldout_prompts(8)))
    out = subprocess.run([sys.executable, "-m", "engine", "eval-heads", "--model", "demo", "--data", str(text),
                          "--seq", "64", "--batch", "4", "--positions", "400"], capture_output=True, text=True, check=True)
    acc = json.loads(out.stdout)["heldout"]
    assert [a["head"] for a in acc] == [0, 1, 2, 3]
    assert all(a["top1"] <= a["top5"] for a in acc)
    assert acc[0]["top1"] > 0.2 and acc[0]["top1"] >= acc[3]["top1"]  # t+2 is easier to guess than t+5
