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
        assert md.mean_accepted > 1.2  # real heads: the tree pays on held-out code


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


def test_train_heads_loss_goes_down_and_resumes(tmp_path):
    from conftest import make_hf_model

    from engine.train_heads import train_heads

    make_hf_model(tmp_path / "m", "llama", n_kv=2)
    data = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0))
    data = torch.cat([data[:200]] * 20)  # repetitive text: learnable in a few steps
    (tmp_path / "tok.npy").write_bytes(b"")
    import numpy as np

    np.save(tmp_path / "tok.npy", data.numpy())
    out = tmp_path / "heads.safetensors"
    rep = train_heads(str(tmp_path / "m"), str(tmp_path / "tok.npy"), str(out), num_heads=2, steps=30, batch=4,
                      seq=64, lr=3e-3, eval_every=15, shared_lm_head=False, device="cpu", log=lambda *_: None)
    losses = [h["loss"] for h in rep["history"]]
    assert losses[-1] < losses[0]
    eng = engine.load(tmp_path / "m", heads=out, device="cpu")
    assert eng.num_heads == 2 and not eng.heads.shared_lm_head
    rep2 = train_heads(str(tmp_path / "m"), str(tmp_path / "tok.npy"), str(out), num_heads=2, steps=45, batch=4,
                       seq=64, lr=3e-3, eval_every=15, shared_lm_head=False, device="cpu", log=lambda *_: None)
    assert [h["step"] for h in rep2["history"]] == [15, 30, 45]  # resumed at 30, not from scratch
