"""Incremental detokenisation: the text each step adds, with O(step) work and exact multi-byte text.

Decoding the whole output after every step costs O(n) per step (0.55 ms at 900 tokens, more than a
GPU AR step), and diffing two whole decodes breaks when a character's bytes span tokens: the first
token alone decodes to U+FFFD, which the next decode replaces. Instead we decode a short window:
the tokens of the last emitted piece (left context, so tokenizers that strip or merge at the start
of a sequence see the same neighbours as in the whole text) plus the new ones, and emit what the
window adds beyond its context. A window that ends in U+FFFD is an incomplete character: nothing is
emitted until its last byte arrives (or the run ends, when `flush` emits the rest as the whole
decode would). Joined, the pieces equal `decode(tokenizer, all_ids)` (tests/test_detok.py checks a
byte-level BPE and a SentencePiece-style tokenizer on non-ASCII text).

Windows work because the text of a prefix of tokens is a prefix of the whole text. transformers'
`clean_up_tokenization_spaces` breaks that (it deletes a space before punctuation or a contraction
depending on the token that follows: "it '" then "it's"), and it rewrites text the model wrote
(`f(a , b)` becomes `f(a, b)`), so the engine never applies it: every text it gives, streamed,
whole or per token, is the tokens' own text (`decode`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

REPLACEMENT = "\ufffd"


@functools.cache
def _decodes_with_backend(cls: type) -> bool:
    """Whether a tokenizer class decodes as its Rust backend does: its `_decode` is the one of the
    class that holds `backend_tokenizer` (transformers' fast tokenizer), and no subclass below that
    one overrides `decode`. Then, without the clean-up of spaces, transformers' decode is the
    backend's decode after some 7 µs of Python (argument conversion, dispatch), which a streamed run
    pays twice a step (`IncrementalDetokenizer.push`): on a small model that is host time the GPU
    waits for."""
    def owner(name: str) -> type | None:
        return next((c for c in cls.__mro__ if name in vars(c)), None)

    fast = owner("_decode")
    return fast is not None and "backend_tokenizer" in vars(fast) and owner("decode") in fast.__mro__


def decode(tokenizer, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The tokens' own text, without transformers' clean-up of spaces (see the module docstring)."""
    if _decodes_with_backend(type(tokenizer)):
        return tokenizer.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.context = 0  # ids[context:emitted] is the left context of the next window
        self.emitted = 0  # ids[:emitted] are accounted for in the text returned so far

    def _decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:  # token ids as text, space-separated (models without a tokenizer)
            return " ".join(map(str, ids))
        return decode(self.tokenizer, ids, self.skip)

    def push(self, ids: Sequence[int]) -> str:
        """Add a step's tokens; return the text they complete (possibly '')."""
        self.ids.extend(ids)
        if self.tokenizer is None:
            piece = (" " if self.emitted else "") + self._decode(self.ids[self.emitted:]) if ids else ""
            self.emitted = len(self.ids)
            return piece
        before = self._decode(self.ids[self.context : self.emitted])
        window = self._decode(self.ids[self.context :])
        if len(window) <= len(before) or window.endswith(REPLACEMENT):
            return ""  # an incomplete character, or nothing visible yet: wait for more tokens
        self.context, self.emitted = self.emitted, len(self.ids)
        return window[len(before) :]

    def flush(self) -> str:
        """At the end of a run: whatever is still held back (an unfinished character decodes as U+FFFD)."""
        if self.emitted == len(self.ids) or self.tokenizer is None:
            return ""
        before = self._decode(self.ids[self.context : self.emitted])
        window = self._decode(self.ids[self.context :])
        self.context, self.emitted = self.emitted, len(self.ids)
        return window[len(before) :]


class TokenTexts(dict):
    """Each token's own text (special tokens named), decoded at first use and kept: `texts[token]`.
    A traced step names some 45 tokens in its trace line (`StepEvent.to_json`); a hit here is one
    dict lookup with no Python call."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    def __missing__(self, token: int) -> str:
        text = decode(self.tokenizer, [token], skip_special_tokens=False) if self.tokenizer is not None else f"<{token}>"
        self[token] = text
        return text
