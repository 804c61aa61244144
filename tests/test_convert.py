"""inspect and convert-heads: round trips keep head outputs identical; refusals and mismatches are clear."""

import itertools
import json

import pytest
import torch
from conftest import VOCAB, make_hf_model, random_heads_sd
from safetensors.torch import load_file, save_file

import engine
from engine.cli import main
from engine.convert import convert, inspect, tp_shards


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("cbase")
    make_hf_model(d, "llama", n_kv=2)
    return d


def head_outputs(base, heads_path):
    eng = engine.load(base, heads=heads_path, device="cpu")
    h = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    return eng.heads(h, eng.model.lm_head.weight)


def sources(base, tmp_path):
    """One file per format; all describe the same heads (the shared ones use the base lm_head)."""
    shared = random_heads_sd(num_heads=3, vocab=None)
    lm = load_file(str(base / "model.safetensors"))["lm_head.weight"]
    fd = dict(shared, **{f"{h}.1.weight": lm.clone() for h in range(3)})
    save_file(shared, str(tmp_path / "medusa_heads.safetensors"))
    save_file(fd, str(tmp_path / "medusa_lm_head.safetensors"))
    torch.save(fd, tmp_path / "medusa_lm_head.pt")
    m2 = tmp_path / "m2"
    convert(tmp_path / "medusa_heads.safetensors", "medusa2", m2, model=base)
    return {"shared-lm-head": tmp_path / "medusa_heads.safetensors", "faster-decoding": tmp_path / "medusa_lm_head.safetensors",
            "pt": tmp_path / "medusa_lm_head.pt", "medusa2": m2}


def test_round_trips_between_every_pair(base, tmp_path):
    src = sources(base, tmp_path)
    ref = head_outputs(base, src["shared-lm-head"])
    for (name, path), to in itertools.product(src.items(), ["faster-decoding", "safetensors", "shared-lm-head", "medusa2"]):
        out = tmp_path / f"{name}-to-{to}" / ("model" if to == "medusa2" else "heads.safetensors")
        convert(path, to, out, model=base)
        if to == "medusa2":
            eng = engine.load(out, device="cpu")
            h = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
            got = eng.heads(h, eng.model.lm_head.weight)
        else:
            got = head_outputs(base, out)
        torch.testing.assert_close(got, ref, msg=f"{name} -> {to}")


def test_faster_decoding_keys_and_shapes(base, tmp_path):
    src = sources(base, tmp_path)
    out = tmp_path / "fd.safetensors"
    convert(src["shared-lm-head"], "faster-decoding", out, model=base)
    sd = load_file(str(out))
    assert set(sd) == {f"{h}.0.linear.{w}" for h in range(3) for w in ("weight", "bias")} | {f"{h}.1.weight" for h in range(3)}
    assert sd["0.0.linear.weight"].shape == (64, 64) and sd["2.0.linear.bias"].shape == (64,)
    assert sd["1.1.weight"].shape == (VOCAB, 64)


def test_lossy_refused_unless_allowed_and_reports_accuracy(base, tmp_path):
    f = tmp_path / "private.safetensors"
    save_file(random_heads_sd(num_heads=2), str(f))  # random private projections != lm_head
    with pytest.raises(ValueError, match="refusing a lossy conversion"):
        convert(f, "shared-lm-head", tmp_path / "x.safetensors", model=base)
    import numpy as np

    np.save(tmp_path / "data.npy", np.random.default_rng(0).integers(0, VOCAB, 2000))
    rep = convert(f, "shared-lm-head", tmp_path / "x.safetensors", model=base, allow_lossy=True, data=str(tmp_path / "data.npy"))
    assert rep["lossy"] and len(rep["heldout_top1_before"]) == 2 and len(rep["heldout_top1_after"]) == 2
    with pytest.raises(ValueError, match="pass --model"):
        convert(tmp_path / "x.safetensors", "faster-decoding", tmp_path / "y.safetensors")


def test_dtype_and_tp_shards(base, tmp_path):
    src = sources(base, tmp_path)
    rep = convert(src["faster-decoding"], "safetensors", tmp_path / "h.safetensors", dtype="bfloat16", tp=2)
    assert len(rep["out"]) == 2
    shards = [load_file(p) for p in rep["out"]]
    assert shards[0]["0.0.linear.weight"].shape == (32, 64) and shards[0]["0.0.linear.weight"].dtype == torch.bfloat16
    assert shards[1]["2.1.weight"].shape == (VOCAB, 32)
    full = load_file(str(src["faster-decoding"]))
    torch.testing.assert_close(torch.cat([s["0.0.linear.weight"] for s in shards]).float(),
                               full["0.0.linear.weight"].to(torch.bfloat16).float())
    with pytest.raises(engine.ModelLoadError, match="--tp 3 does not divide hidden size 64"):
        tp_shards(full, 1, 3)


def test_inspect(base, tmp_path, capsys, llama_dir):
    info = inspect(llama_dir)
    h = info["heads"]
    assert h["num_heads"] == 5 and h["resblocks_per_head"] == 1 and not h["shares_base_lm_head"]
    assert h["parameters"] == 5 * (64 * 64 + 64 + VOCAB * 64) and info["base"]["kv_heads"] == 2
    assert info["mismatch"] == [] and h["bytes_per_step_added"] == h["bytes"]
    wrong = tmp_path / "wrong.safetensors"
    save_file(random_heads_sd(num_heads=2, dim=32, vocab=50), str(wrong))
    bad = inspect(wrong, model=base)
    want = "key '0.0.linear.weight' has shape (32, 32), the base model needs (64, 64)"
    assert len(bad["mismatch"]) == 1 and want in bad["mismatch"][0]
    with pytest.raises(engine.ModelLoadError) as refused:  # what generate says: inspect and load never disagree
        engine.load(base, heads=wrong, device="cpu")
    assert want in str(refused.value)
    assert main(["inspect", str(wrong), "--model", str(base)]) == 1
    assert f"mismatch: {want}" in capsys.readouterr().out.replace(f"{wrong}: ", "")
    assert main(["inspect", str(llama_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["heads"]["format"] == "faster-decoding"
    (tmp_path / "empty").mkdir()
    assert inspect(tmp_path / "empty", model=base)["heads"] is None  # a base model with no heads is reported, not an error
    src = sources(base, tmp_path)
    assert inspect(src["medusa2"])["heads"]["format"] == "medusa2"
    assert inspect(src["shared-lm-head"], model=base)["heads"]["format"] == "shared-lm-head"
    assert main(["convert-heads", str(wrong), "--to", "shared-lm-head", "--out", str(tmp_path / "z.safetensors")]) == 2
    assert "refusing a lossy conversion" in capsys.readouterr().err


def official_heads_folder(path, base_name, num_heads: int = 3, num_layers: int = 1, stated_heads: int | None = None):
    """FasterDecoding's published layout, as the medusa-vicuna-7b-v1.3 repos have it: a config.json with
    only the Medusa fields beside medusa_lm_head.pt (each head with its own projection)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"medusa_num_heads": stated_heads or num_heads, "medusa_num_layers": num_layers,
           "base_model_name_or_path": str(base_name), "transformers_version": "4.34.1"}
    (path / "config.json").write_text(json.dumps(cfg))
    torch.save(random_heads_sd(num_heads=num_heads, num_layers=num_layers), path / "medusa_lm_head.pt")
    return path


def test_official_heads_folder_is_inspected_and_decodes(base, tmp_path, capsys):
    folder = official_heads_folder(tmp_path / "medusa-heads", base)
    info = inspect(folder)
    assert info["heads_folder"]["base_model_name_or_path"] == str(base) and info["heads_folder"]["base_here"] == str(base)
    assert info["heads_folder"]["disagrees"] == [] and info["mismatch"] == []
    assert info["heads"]["num_heads"] == 3 and info["heads"]["format"] == "faster-decoding"
    assert info["base"]["dir"] == str(base)
    # --model on the folder: its base with its heads; the same tokens as naming both
    via_folder = engine.load(folder, device="cpu")
    assert via_folder.heads is not None and via_folder.heads.num_heads == 3
    both = engine.load(base, heads=folder / "medusa_lm_head.pt", device="cpu")
    a = via_folder.generate([1, 2, 3], 16, mode="medusa", tree="chain_3")
    b = both.generate([1, 2, 3], 16, mode="medusa", tree="chain_3")
    assert a.token_ids == b.token_ids and a.steps == b.steps
    assert a.token_ids == both.generate([1, 2, 3], 16, mode="ar").token_ids  # greedy Medusa: plain greedy's tokens
    # a base that is not here: one line naming it and what to pass instead
    away = official_heads_folder(tmp_path / "away", "lmsys/vicuna-7b-v1.3")
    assert main(["inspect", str(away)]) == 0
    out = capsys.readouterr().out
    assert "for base model 'lmsys/vicuna-7b-v1.3'" in out and "pass --model BASE_DIR --heads" in out
    assert main(["generate", "--model", str(away), "--prompt-ids", "1,2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "lmsys/vicuna-7b-v1.3" in err
    # the config and the file disagree: inspect says so, load refuses
    liar = official_heads_folder(tmp_path / "liar", base, stated_heads=5)
    assert main(["inspect", str(liar)]) == 1
    assert "config.json says medusa_num_heads 5, medusa_lm_head.pt holds 3" in capsys.readouterr().out
    with pytest.raises(engine.ModelLoadError, match="medusa_num_heads 5"):
        engine.load(liar, device="cpu")
    with pytest.raises(engine.ModelLoadError, match="medusa_num_heads 5"):
        convert(liar, "safetensors", tmp_path / "liar.safetensors")
    # a base that is itself a heads folder (here: the folder itself) is named as such
    selfish = official_heads_folder(tmp_path / "selfish", tmp_path / "selfish")
    with pytest.raises(engine.ModelLoadError, match="is a heads folder, not a model"):
        engine.load(selfish, device="cpu")


# vLLM's Medusa draft module, vllm/model_executor/models/medusa.py (vllm-project/vllm @ 01dbb08):
#   self.blocks = nn.ModuleList([ResidualBlock(...) for _ in range(num_heads)])
#   ResidualBlock: self.layers = nn.ModuleList([nn.Linear(hidden, hidden, bias=getattr(config, "medusa_fc_bias", False))
#                                               for _ in range(num_layers)])
#   self.lm_heads = nn.ModuleList([ParallelLMHead(vocab, hidden) for _ in range(num_heads)])
#   (or, with config.original_lm_head, one self.lm_head shared by every head)
def vllm_module_names(num_heads: int, num_layers: int, dim: int, vocab: int, original_lm_head: bool) -> dict:
    names = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            names[f"blocks.{h}.layers.{layer}.weight"] = (dim, dim)
            names[f"blocks.{h}.layers.{layer}.bias"] = (dim,)
        if not original_lm_head:
            names[f"lm_heads.{h}.weight"] = (vocab, dim)
    if original_lm_head:
        names["lm_head.weight"] = (vocab, dim)
    return names


def test_convert_to_vllm_has_exactly_vllms_names_and_shapes(base, tmp_path, capsys):
    src = sources(base, tmp_path)
    lm = load_file(str(base / "model.safetensors"))["lm_head.weight"]
    for name, shared in (("faster-decoding", False), ("shared-lm-head", True)):
        out = tmp_path / f"vllm-{name}"
        assert main(["convert-heads", str(src[name]), "--to", "vllm", "--out", str(out), "--model", str(base)]) == 0
        sd = load_file(str(out / "model.safetensors"))
        assert {k: tuple(v.shape) for k, v in sd.items()} == vllm_module_names(3, 1, 64, VOCAB, original_lm_head=shared)
        cfg = json.loads((out / "config.json").read_text())
        assert (cfg["model_type"], cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == \
            ("medusa", 3, 1, 64, VOCAB)
        assert cfg["medusa_fc_bias"] is True and cfg["original_lm_head"] is shared  # without the flag vLLM drops the biases
        ours = load_file(str(src["faster-decoding"]))
        for h in range(3):
            assert torch.equal(sd[f"blocks.{h}.layers.0.weight"], ours[f"{h}.0.linear.weight"])
            assert torch.equal(sd[f"blocks.{h}.layers.0.bias"], ours[f"{h}.0.linear.bias"])
            assert torch.equal(sd.get(f"lm_heads.{h}.weight", sd.get("lm_head.weight")), lm)
    capsys.readouterr()
    assert main(["convert-heads", str(src["shared-lm-head"]), "--to", "vllm", "--out", str(tmp_path / "v")]) == 2
    assert "pass --model DIR" in capsys.readouterr().err
    # never into an existing folder (a model's own would be overwritten file by file) or over a file
    model_copy = tmp_path / "model_copy"
    model_copy.mkdir()
    (model_copy / "config.json").write_text("{}")
    for out, want in ((model_copy, "already exists and is not empty"), (model_copy / "config.json", "a file")):
        assert main(["convert-heads", str(src["faster-decoding"]), "--to", "vllm", "--out", str(out)]) == 2
        assert want in capsys.readouterr().err
    assert (model_copy / "config.json").read_text() == "{}" and not (model_copy / "model.safetensors").exists()
    # an official folder of shared heads names its base: no --model needed to copy the base lm_head in
    shared_folder = tmp_path / "shared_folder"
    shared_folder.mkdir()
    (shared_folder / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "base_model_name_or_path": str(base)}))
    save_file(load_file(str(src["shared-lm-head"])), str(shared_folder / "medusa_lm_head.safetensors"))
    assert main(["convert-heads", str(shared_folder), "--to", "vllm", "--out", str(tmp_path / "v2")]) == 0
    assert torch.equal(load_file(str(tmp_path / "v2" / "model.safetensors"))["lm_head.weight"], lm)
