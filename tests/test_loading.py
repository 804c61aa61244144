"""Head formats, strict loading and the error messages users see."""

import json

import pytest
import torch
from conftest import VOCAB, make_hf_model, random_heads_sd
from safetensors.torch import save_file

import engine
from engine import GenerationError, ModelLoadError


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    make_hf_model(d, "llama", n_kv=2)
    return d


def outputs(eng, ids=(1, 2, 3, 4, 5)):
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    return eng.heads(h, eng.model.lm_head.weight)


def test_faster_decoding_pt_and_safetensors_read_counts_from_keys(llama_dir, tmp_path):
    eng = engine.load(llama_dir, device="cpu")  # finds medusa_lm_head.safetensors; config_medusa says 2
    assert eng.num_heads == 5 and eng.heads.num_layers == 1 and not eng.heads.shared_lm_head
    pt = tmp_path / "medusa_lm_head.pt"
    torch.save(random_heads_sd(), pt)
    eng_pt = engine.load(llama_dir, heads=pt, device="cpu")
    torch.testing.assert_close(outputs(eng_pt), outputs(eng))


def test_shared_lm_head_format(base_dir, tmp_path):
    sd = random_heads_sd(num_heads=3, num_layers=2, vocab=None)
    f = tmp_path / "medusa_heads.safetensors"
    save_file(sd, str(f))
    eng = engine.load(base_dir, heads=f, device="cpu")
    assert eng.num_heads == 3 and eng.heads.num_layers == 2 and eng.heads.shared_lm_head
    h = torch.randn(2, 64)
    x = h
    for layer in range(2):  # direct transcription of head 1: ResBlocks then the base lm_head
        w, b = sd[f"1.{layer}.linear.weight"], sd[f"1.{layer}.linear.bias"]
        x = x + torch.nn.functional.silu(x @ w.T + b)
    torch.testing.assert_close(eng.heads(h, eng.model.lm_head.weight)[1], x @ eng.model.lm_head.weight.T,
                               atol=1e-5, rtol=1e-5)


def test_medusa2_full_checkpoint(tmp_path):
    make_hf_model(tmp_path, "llama", n_kv=2)
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    sd.update({f"medusa_head.{k}": v for k, v in random_heads_sd(num_heads=4).items()})
    save_file(sd, str(tmp_path / "model.safetensors"))
    eng = engine.load(tmp_path, device="cpu")
    assert eng.num_heads == 4 and "medusa_head" in eng.heads_source
    ar = eng.generate([3, 1, 4, 1, 5], 20, mode="ar").token_ids
    assert eng.generate([3, 1, 4, 1, 5], 20, mode="medusa", tree="mc_sim_7b_63").token_ids == ar


@pytest.mark.parametrize("mutate, msg", [
    (lambda sd: sd.pop("2.0.linear.bias"), "key '2.0.linear.bias' is missing"),
    (lambda sd: sd.__setitem__("0.0.linear.weight", torch.zeros(32, 32)), "'0.0.linear.weight' has shape (32, 32)"),
    (lambda sd: sd.__setitem__("1.1.weight", torch.zeros(VOCAB + 1, 64)), "'1.1.weight' has shape"),
    (lambda sd: sd.__setitem__("medusa.extra", torch.zeros(1)), "'medusa.extra' matches no Medusa head format"),
    (lambda sd: sd.pop("3.1.weight"), "heads disagree"),
])
def test_bad_heads_name_the_key(base_dir, mutate, msg):
    sd = random_heads_sd()
    mutate(sd)
    with pytest.raises(ModelLoadError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        engine.load(base_dir, heads=sd, device="cpu")


def test_pickle_pt_is_refused(base_dir, tmp_path):
    f = tmp_path / "medusa_lm_head.pt"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"0.0.linear.weight": Evil()}, f)
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        engine.load(base_dir, heads=f, device="cpu")


def test_model_errors(tmp_path, base_dir):
    with pytest.raises(ModelLoadError, match="no such model directory"):
        engine.load(tmp_path / "missing")
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        engine.load("nobody/no-such-model-xyz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        engine.load(tmp_path / "empty")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="model_type 'gpt2'.*not supported"):
        engine.load(gpt2)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((base_dir / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="model.safetensors: cannot read weights"):
        engine.load(broken)
    from safetensors.torch import load_file

    sd = load_file(str(base_dir / "model.safetensors"))
    sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, str(broken / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="missing weight key 'model.layers.1.mlp.up_proj.weight'"):
        engine.load(broken)


def test_generation_errors(base_dir):
    eng = engine.load(base_dir, heads=random_heads_sd(), device="cpu")
    cases = [
        (dict(prompt_or_ids=[], max_new_tokens=5), "prompt is empty"),
        (dict(prompt_or_ids=[1, 2], max_new_tokens=0), "positive integer"),
        (dict(prompt_or_ids=[1, 2], max_new_tokens=5, mode="beam"), "unknown mode 'beam'"),
        (dict(prompt_or_ids=[1, VOCAB], max_new_tokens=5), "outside the vocabulary"),
        (dict(prompt_or_ids=[1] * 200, max_new_tokens=100), "exceeds the context of 256"),
        (dict(prompt_or_ids=[1, 2], max_new_tokens=5, tree=[[0, 1]]), r"bad tree: path \[0, 1\]: its prefix \[0\]"),
        (dict(prompt_or_ids=[1, 2], max_new_tokens=5, tree=[[0]] + [[0] * d for d in range(2, 7)]), "exceeds the 5 heads"),
        (dict(prompt_or_ids=[1, 2], max_new_tokens=5, accept="typical", temperature=-1), "temperature must be >= 0"),
    ]
    for kw, msg in cases:
        with pytest.raises(GenerationError, match=msg):
            eng.generate(**kw)
    no_heads = engine.load(base_dir, heads=False, device="cpu")
    with pytest.raises(GenerationError, match="needs Medusa heads"):
        no_heads.generate([1, 2], 5, mode="medusa")


@pytest.mark.parametrize("tied, stored", [(True, "its own lm_head"), (True, "a copy of the embedding"), (True, "no lm_head"),
                                          (False, "its own lm_head")])
def test_tied_and_untied_checkpoints_load_as_transformers_loads_them(tmp_path, tied, stored):
    """Which matrix is the output layer when config.json says tie_word_embeddings and the file stores
    an lm_head.weight anyway: transformers itself (as installed) is the reference."""
    import transformers
    from safetensors.torch import load_file

    make_hf_model(tmp_path, "llama", tied=False, seed=4)
    sd = load_file(str(tmp_path / "model.safetensors"))
    if stored == "a copy of the embedding":
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    elif stored == "no lm_head":
        del sd["lm_head.weight"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": tied}))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    eng = engine.load(tmp_path, heads=False, device="cpu", dtype="float32")
    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits[0]
        eng.model.setup_cache(1, 32)
        hidden = eng.model(ids, torch.arange(16))[0]
        got = eng.model.lm_head(hidden)
        other = hidden @ (sd["lm_head.weight"] if eng.model.lm_head.weight is eng.model.embed_tokens.weight
                          else eng.model.embed_tokens.weight).T if "lm_head.weight" in sd else None
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    if stored == "its own lm_head":  # the other matrix really gives other logits: the choice is what is tested
        assert not torch.allclose(other, want, atol=1e-2)
