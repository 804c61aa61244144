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
