"""Incremental detokenisation: streamed pieces join to the whole decode, multi-byte characters
included, for a byte-level BPE (the demo's) and a SentencePiece-style tokenizer (Llama's decoder
chain: metaspace, byte fallback, strip), pushed in chunks of any size."""

import random

import pytest

from engine.detok import IncrementalDetokenizer, TokenTexts, _decodes_with_backend, decode

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


@pytest.mark.parametrize("which", ["byte_level", "sentencepiece_style"])
def test_decode_takes_the_backend_and_equals_transformers(which, request):
    """`decode` skips transformers' Python wrapper for a stock fast tokenizer: the same text, special
    tokens kept or skipped, on any ids; a subclass that overrides `_decode` is obeyed."""
    tok = request.getfixturevalue(which)
    assert _decodes_with_backend(type(tok))  # the fast path is the one under test
    rng = random.Random(2)
    specials = tok.all_special_ids
    assert specials
    for _ in range(200):
        seq = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tok)) for _ in range(rng.randint(0, 12))]
        for skip in (True, False):
            want = tok.decode(seq, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert decode(tok, seq, skip) == want, (which, seq, skip)

    class Shouting(type(tok)):
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).upper()

    assert not _decodes_with_backend(Shouting)
    ids = tok.encode("déjà vu, naïve", add_special_tokens=False)
    plain = decode(tok, ids)
    tok.__class__ = Shouting  # the fixture is module-scoped: put the class back
    try:
        assert decode(tok, ids) == plain.upper() != plain
    finally:
        tok.__class__ = Shouting.__mro__[1]


def test_token_texts_name_special_tokens_and_decode_each_token_once(byte_level, monkeypatch):
    """A trace names every token, special ones included (its EOS shows as itself, not as "")."""
    texts = TokenTexts(byte_level)
    eos = byte_level.eos_token_id
    assert texts[eos] == byte_level.convert_ids_to_tokens(eos) != ""
    calls = []
    monkeypatch.setattr("engine.detok.decode", lambda *a, **k: calls.append(a) or "x")
    assert texts[eos] == byte_level.convert_ids_to_tokens(eos) and calls == []  # kept: not decoded again
    assert texts[7] == "x" and texts[7] == "x" and len(calls) == 1
    assert TokenTexts(None)[5] == "<5>"


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


# transformers 4.x's clean_up_tokenization, applied under clean_up_tokenization_spaces=True (5.x skips it for BPE)
CLEANUP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
           (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]


class CleaningTokenizer:
    """A tokenizer whose decode cleans up spaces as transformers 4.x does when its
    clean_up_tokenization_spaces is True, unless the caller says False."""

    clean_up_tokenization_spaces = True

    def __init__(self, inner):
        self.inner = inner

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        text = self.inner.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
        if self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces:
            for a, b in CLEANUP:
                text = text.replace(a, b)
        return text

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_streaming_under_clean_up_tokenization_spaces_is_the_tokens_own_text(byte_level):
    """With the clean-up on, "it '" decodes as is but "it 's" as "it's": a window that assumed the
    first is a prefix of the second streamed "it ' ok". The stream is the tokens' own text."""
    tok = CleaningTokenizer(byte_level)
    text = "it 's ok , isn 't it ? I 'm sure . x = f(a , b) ! they 're here , we 've seen ' em"
    ids = byte_level.encode(text)
    assert tok.decode(ids) != text  # the clean-up really changes this text
    rng = random.Random(1)
    for _ in range(10):
        assert "".join(_pieces(tok, ids, rng)) == text == byte_level.decode(ids)


def test_engine_text_is_the_tokens_own_text_under_clean_up(demo_engine, monkeypatch):
    monkeypatch.setattr(demo_engine, "tokenizer", CleaningTokenizer(demo_engine.tokenizer))
    monkeypatch.setattr(demo_engine, "_token_text", TokenTexts(demo_engine.tokenizer))
    prompt = "names = ['a' , 'b' , 'c' , "
    events = list(demo_engine.stream(prompt, 40, trace=True))
    ids = [t for e in events for t in e.tokens]
    own = demo_engine.tokenizer.inner.decode(ids)
    assert " , " in own  # the model wrote what the clean-up rewrites
    assert "".join(e.text for e in events) == demo_engine.text_of(ids) == own
    assert all(e.trace["node_text"][0] == demo_engine.tokenizer.inner.decode([e.tokens[0]]) for e in events)  # traces too


def test_a_run_that_ends_inside_a_character_streams_its_bytes_as_the_whole_decode(demo_engine):
    """The token limit falls inside a character whose bytes span tokens: the last step's text must still
    end with what decoding the whole output gives (the final flush), not drop it."""
    prompt = 'a = "🙂🙂"\nb = "🙂🙂"\nc = "'
    full = demo_engine.generate(prompt, 30, mode="ar").token_ids
    split = [i for i, t in enumerate(full) if "\ufffd" in demo_engine.tokenizer.decode([t])]
    assert split  # the model writes characters whose bytes span tokens here
    cut = split[0] + 1  # stop right after the first partial token
    for mode in ("ar", "medusa"):
        events = list(demo_engine.stream(prompt, cut, mode=mode))
        ids = [t for e in events for t in e.tokens]
        assert ids == full[:cut] and "".join(e.text for e in events) == demo_engine.text_of(ids)
        assert demo_engine.text_of(ids).endswith("\ufffd")
