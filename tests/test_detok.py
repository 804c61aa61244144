"""Incremental detokenisation: streamed pieces join to the whole decode, multi-byte characters
included, for a byte-level BPE (the demo's) and a SentencePiece-style tokenizer (Llama's decoder
chain: metaspace, byte fallback, strip), pushed in chunks of any size."""

import random

import pytest

from engine.detok import IncrementalDetokenizer

TEXT = ("déjà vu: naïve café — 🙂👍🏽 ünïcödé, 中文字符, русский текст, ελληνικά; emoji 🎉🚀 and "
        "plain ASCII code: def f(x):\n    return x ** 2  # ∑ ∫ ≤ ≥\n") * 3


@pytest.fixture(scope="module")
def sentencepiece_style(tmp_path_factory):
    """A small BPE in Llama-2's tokenizer.json layout, trained offline on TEXT."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"] + bytes_,
                                  show_progress=False, limit_alphabet=40)
    tok.train_from_iterator([TEXT], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def byte_level(demo_engine):
    return demo_engine.tokenizer


def _pieces(tok, ids, rng):
    d = IncrementalDetokenizer(tok)
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 6)  # a Medusa step commits 1..depth+1 tokens
        out.append(d.push(ids[i : i + n]))
        i += n
    out.append(d.flush())
    return out


@pytest.mark.parametrize("which", ["byte_level", "sentencepiece_style"])
def test_pieces_join_to_the_whole_decode(which, request):
    tok = request.getfixturevalue(which)
    rng = random.Random(0)
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert "".join(_pieces(tok, ids, rng)) == tok.decode(ids, skip_special_tokens=True)
    vocab = len(tok)
    for trial in range(40):  # arbitrary id sequences: broken byte runs, special tokens, anything a model writes
        seq = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        assert "".join(_pieces(tok, seq, rng)) == tok.decode(seq, skip_special_tokens=True), (which, trial, seq)


def test_a_character_split_across_tokens_is_held_back_then_emitted_once(byte_level):
    ids = byte_level.encode("a🙂b")
    per_token = [byte_level.decode([i]) for i in ids]
    assert any("\ufffd" in t for t in per_token)  # the emoji's bytes span tokens in this vocabulary
    d = IncrementalDetokenizer(byte_level)
    pieces = [d.push([i]) for i in ids] + [d.flush()]
    assert "".join(pieces) == "a🙂b" and "\ufffd" not in "".join(pieces)
    assert "🙂" in pieces  # emitted whole, by the step that completed it


def test_unfinished_character_at_the_end_decodes_like_the_whole(byte_level):
    ids = byte_level.encode("x🙂")[:-1]  # the run ended inside the emoji
    d = IncrementalDetokenizer(byte_level)
    pieces = [d.push(ids)] + [d.flush()]
    assert "".join(pieces) == byte_level.decode(ids)


def test_streamed_text_equals_generated_text_on_non_ascii_prompts(demo_engine):
    """Prompts the demo model continues with characters whose bytes span tokens (checked below):
    the streamed pieces used to repeat the whole text there."""
    prompts = ['x = "é"\ny = "é"\nz = "é"\nw = "', 'a = "🙂🙂"\nb = "🙂🙂"\nc = "', 's = "中文"\nt = "中文"\nu = "',
               "'ü', 'ü', 'ü', 'ü', '"]
    split = 0
    for p in prompts:
        for mode in ("ar", "medusa"):
            events = list(demo_engine.stream(p, 60, mode=mode))
            res = demo_engine.generate(p, 60, mode=mode)
            joined = "".join(e.text for e in events)
            assert joined == res.text == demo_engine.text_of(res.token_ids), (p, mode)
            assert [t for e in events for t in e.tokens] == res.token_ids
            split += sum("\ufffd" in demo_engine.tokenizer.decode([t]) for t in res.token_ids)
    assert split > 20  # the runs really wrote characters split across tokens
