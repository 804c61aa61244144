"""`import-gguf` on tiny GGUF files the tests write themselves (gguf.GGUFWriter): the imported folder
must compute what transformers' own GGUF loader computes, and bad files must give one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package (the [gguf] extra) is not installed")

import engine  # noqa: E402
from engine.config import ModelLoadError  # noqa: E402
from engine.gguf_import import import_gguf, unpermute_rows  # noqa: E402

DIM, HEADS, LAYERS, FFN, CTX = 64, 4, 2, 96, 128
Q = gguf.GGMLQuantizationType


def byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (what BPE vocabularies store)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (the inverse of what the importer must do)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch: str = "llama", n_kv: int = 2, tied: bool = True, qtype=Q.F32, seed: int = 0,
               drop: str | None = None, reshape: str | None = None, extra: str | None = None):
    """A tiny random model of `arch` as GGUF, written the way llama.cpp's converter writes one
    (q/k rows permuted for llama). drop/reshape/extra: corrupt one tensor for the error tests."""
    rng = np.random.default_rng(seed)
    base = byte_tokens()
    merges = ["Ġ t", "h e", "Ġt he", "i n"]
    tokens = base + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    hd = DIM // HEADS
    w = gguf.GGUFWriter(str(path), "llama" if arch == "mistral" else arch)
    w.add_name("Mistral-tiny" if arch == "mistral" else f"tiny-{arch}")  # llama.cpp writes Mistral as llama
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab - 3) + [3, 3, 3])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    permute = arch != "qwen2"

    def tensor(name, shape, scale=0.08):
        if name == drop:
            return
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if name.endswith("weight") and len(shape) == 1:
            data = 1 + data
        if permute and name.endswith("attn_q.weight"):
            data = llamacpp_permute(data, HEADS)
        if permute and name.endswith("attn_k.weight"):
            data = llamacpp_permute(data, n_kv)
        if name == reshape:
            data = data[:-1]
        q = qtype if len(shape) == 2 and shape[-1] % 32 == 0 else Q.F32
        if q == Q.F16:
            w.add_tensor(name, data.astype(np.float16))
        elif q != Q.F32:
            w.add_tensor(name, gguf.quants.quantize(data, q), raw_dtype=q)
        else:
            w.add_tensor(name, data)

    tensor("token_embd.weight", (vocab, DIM))
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", (DIM,))
        tensor(f"blk.{i}.attn_q.weight", (DIM, DIM))
        tensor(f"blk.{i}.attn_k.weight", (n_kv * hd, DIM))
        tensor(f"blk.{i}.attn_v.weight", (n_kv * hd, DIM))
        if arch == "qwen2":
            tensor(f"blk.{i}.attn_q.bias", (DIM,), 0.05)
            tensor(f"blk.{i}.attn_k.bias", (n_kv * hd,), 0.05)
            tensor(f"blk.{i}.attn_v.bias", (n_kv * hd,), 0.05)
        tensor(f"blk.{i}.attn_output.weight", (DIM, DIM))
        tensor(f"blk.{i}.ffn_norm.weight", (DIM,))
        tensor(f"blk.{i}.ffn_gate.weight", (FFN, DIM))
        tensor(f"blk.{i}.ffn_up.weight", (FFN, DIM))
        tensor(f"blk.{i}.ffn_down.weight", (DIM, FFN))
    tensor("output_norm.weight", (DIM,))
    if not tied:
        tensor("output.weight", (vocab, DIM))
    if extra:
        tensor(extra, (DIM,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def transformers_logits(gguf_path, ids: list[int]) -> torch.Tensor:
    """transformers' own GGUF path: it dequantises and un-permutes by itself."""
    pytest.importorskip("accelerate", reason="transformers' GGUF loading needs accelerate")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def our_logits(model_dir, ids: list[int]) -> torch.Tensor:
    eng = engine.load(model_dir, heads=False, device="cpu", dtype="float32")
    eng.model.setup_cache(1, 64)
    with torch.no_grad():
        h = eng.model(torch.tensor([ids]), torch.arange(len(ids)), start=0)
        return eng.model.lm_head(h)[0]


@pytest.mark.parametrize("arch,n_kv,tied,qtype", [
    ("llama", 2, True, Q.F32),
    ("llama", 4, False, Q.Q8_0),
    ("llama", 1, True, Q.Q4_1),
    ("mistral", 2, True, Q.F16),
    ("qwen2", 2, False, Q.Q8_0),
])
def test_import_matches_transformers_gguf_loader(tmp_path, arch, n_kv, tied, qtype):
    src = write_gguf(tmp_path / "m.gguf", arch, n_kv, tied, qtype)
    rep = import_gguf(src, tmp_path / "out")
    assert rep["model_type"] == arch and rep["tie_word_embeddings"] == tied
    ids = [5, 80, 17, 200, 33, 7, 120, 64]
    ours = our_logits(tmp_path / "out", ids)
    ref = transformers_logits(src, ids)
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4), (ours - ref).abs().max()


def test_import_writes_a_folder_transformers_and_our_tokenizer_read(tmp_path):
    src = write_gguf(tmp_path / "m.gguf")
    import_gguf(src, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["num_key_value_heads"] == 2
    eng = engine.load(tmp_path / "out", heads=False, device="cpu")
    assert eng.model_dir == tmp_path / "out"
    assert eng.has_chat_template
    ids = eng.encode("the cat", chat=True)
    assert eng.tokenizer.decode(ids).startswith("<|im_start|>user\nthe cat<|im_end|>")
    assert eng.eos_ids == {eng.args.vocab_size - 1}  # <|im_end|>, from the GGUF metadata
    res = eng.generate("the", 4)
    assert res.mode == "ar"  # no heads: AR by default
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32)
    assert hf.config.tie_word_embeddings


def test_unpermute_inverts_llamacpp_permute():
    w = np.random.default_rng(0).standard_normal((24, 5)).astype(np.float32)
    for heads in (1, 2, 3, 6):
        back = unpermute_rows(torch.from_numpy(llamacpp_permute(w, heads)), heads)
        assert torch.equal(back, torch.from_numpy(w))
    assert not torch.equal(torch.from_numpy(llamacpp_permute(w, 2)), torch.from_numpy(w))


def _one_line_error(*args) -> str:
    out = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    return lines[0]


def test_gguf_of_another_architecture_is_one_line(tmp_path):
    src = write_gguf(tmp_path / "m.gguf", arch="gemma")
    assert "architecture 'gemma' is not supported" in _one_line_error("import-gguf", str(src), "--out", str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_truncated_gguf_is_one_line(tmp_path):
    src = write_gguf(tmp_path / "m.gguf", qtype=Q.Q8_0)
    data = src.read_bytes()
    for cut in (len(data) // 2, 200, 10):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        msg = _one_line_error("import-gguf", str(tmp_path / "cut.gguf"), "--out", str(tmp_path / "o"))
        assert "cut.gguf" in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("corrupt,expected", [
    ({"drop": "blk.1.ffn_up.weight"}, "'blk.1.ffn_up.weight', which the file does not hold"),
    ({"reshape": "blk.0.attn_k.weight"}, "tensor 'blk.0.attn_k.weight' has shape"),
    ({"extra": "blk.7.attn_norm.weight"}, "unexpected tensor 'blk.7.attn_norm.weight'"),
])
def test_gguf_whose_tensors_disagree_with_its_metadata_is_one_line(tmp_path, corrupt, expected):
    src = write_gguf(tmp_path / "m.gguf", **corrupt)
    assert expected in _one_line_error("import-gguf", str(src), "--out", str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_gguf_path_as_model_says_to_import_it(tmp_path):
    src = write_gguf(tmp_path / "m.gguf")
    assert "import-gguf" in _one_line_error("generate", "--model", str(src), "--prompt", "x")
    with pytest.raises(ModelLoadError, match="import-gguf"):
        engine.load(src)


def test_import_refuses_to_overwrite_unless_asked(tmp_path):
    src = write_gguf(tmp_path / "m.gguf")
    (tmp_path / "out").mkdir()
    assert "already exists" in _one_line_error("import-gguf", str(src), "--out", str(tmp_path / "out"))
    out = subprocess.run([sys.executable, "-m", "engine", "import-gguf", str(src), "--out", str(tmp_path / "out"),
                          "--overwrite"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["tensors"] == 2 + 9 * LAYERS
