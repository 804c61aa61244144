"""The demo model's training text, rebuilt offline: the running interpreter's standard library.

Every `*.py` file under `sysconfig.get_paths()["stdlib"]` (site-packages excluded) that decodes as
UTF-8, in sorted order; held out as `engine.prompts.is_heldout` says (by file, stable across
machines with the same Python). Text is PSF-licensed.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np

from ..prompts import is_heldout, stdlib_files

EOT = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int = 8192):
    """Byte-level BPE; saved through transformers so AutoTokenizer loads it with its EOS token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, unk_token=None, clean_up_tokenization_spaces=False)


def build(out_dir: str | Path, vocab_size: int = 8192, root: Path | None = None) -> dict:
    """Write tokenizer/, train.bin and heldout.bin (uint16 token ids, files joined by EOT), stats.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = stdlib_files(root)
    train = [t for r, t in files if not is_heldout(r)]
    held = [t for r, t in files if is_heldout(r)]
    tokenizer = train_tokenizer(train, vocab_size)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    eot = tokenizer.convert_tokens_to_ids(EOT)
    stats = {"source": f"CPython {sysconfig.get_python_version()} standard library ({sysconfig.get_paths()['stdlib']})",
             "license": "PSF-2.0", "files": len(files), "heldout_files": len(held), "vocab_size": len(tokenizer)}
    for name, texts in (("train", train), ("heldout", held)):
        ids: list[int] = []
        for enc in tokenizer._tokenizer.encode_batch(texts):
            ids.extend(enc.ids)
            ids.append(eot)
        np.asarray(ids, dtype=np.uint16).tofile(out / f"{name}.bin")
        stats[f"{name}_tokens"] = len(ids)
        stats[f"{name}_bytes"] = sum(len(t.encode()) for t in texts)
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    return stats
