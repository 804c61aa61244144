"""`GenerationConfig`: every setting of one generate/stream call, in one dataclass.

The API (`Engine.generate/stream`), the CLI (`generate`, `collect-traces`, `bench`, `spec-bench`) and
the app all build one of these. The CLI's flags are generated from the fields' metadata
(`engine.options.add_generation_arguments`), so a setting is declared once, with its help, here.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from .accept import RULES, Rule
from .sampling import SamplingParams

MODES = ("ar", "medusa")
ACCEPT_RULES = tuple(RULES)
MAX_SEED = 2**63 - 1
# Below these, sampling is NaN: logits / T overflows float32 (vLLM raises small temperatures to 0.01
# for the same reason), and a top_p under float32's smallest normal number rounds to 0 there.
MIN_TEMPERATURE = 0.01
MIN_TOP_P = 2.0**-126


class GenerationError(ValueError):
    """Bad generation settings or input (too long, empty, unknown mode); nothing was run."""


def _flag(help: str, **argparse_kw) -> dict:
    return {"help": help, **argparse_kw}


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = field(default=128, metadata=_flag("tokens to generate at most"))
    mode: str | None = field(default=None, metadata=_flag("ar: one token per step; medusa: tree verification "
                                                          "(default: medusa when heads are loaded, else ar)", choices=MODES))
    tree: Any = field(default=None, metadata=_flag("preset name, tree JSON file, or inline JSON (default: the tree "
                                                   "shipped with the heads, medusa_choices.json)"))
    accept: str = field(default="greedy", metadata=_flag(", ".join(r.label for r in RULES.values()), choices=ACCEPT_RULES))
    temperature: float = field(default=0.7, metadata=_flag("sampling temperature (typical / sample; 0 = greedy)"))
    top_k: int = field(default=0, metadata=_flag("keep the k most likely tokens when sampling (0 = off)"))
    top_p: float = field(default=1.0, metadata=_flag("nucleus sampling mass (1 = off)"))
    seed: int | None = field(default=None, metadata=_flag("seed of the sampling generator"))
    stop_on_eos: bool = field(default=True, metadata=_flag("end a request at the model's EOS token",
                                                           action=argparse.BooleanOptionalAction))
    chat: bool | None = field(default=None, metadata=_flag("wrap each prompt in the tokenizer's chat template "
                                                           "(default: when the tokenizer has one)",
                                                           action=argparse.BooleanOptionalAction))
    trace: bool = field(default=False, metadata={"cli": False})  # StepEvent.trace / Result.traces filled
    trace_heads: bool = field(default=True, metadata=_flag(
        "a traced AR run also records each head's top-k (head statistics, tree optimisation), which runs the "
        "heads: work the untraced AR step does not do. --no-trace-heads traces the target only, with the "
        "untraced step's kernels and one more (a Medusa run's trace always has the top-k its step drafted from)",
        action=argparse.BooleanOptionalAction))
    # False: token ids only, no detokenisation (bulk work such as self-distillation decodes hundreds of
    # requests a step, where decoding their text would cost more host time than the GPU step)
    text: bool = field(default=True, metadata={"cli": False})
    trace_file: str | None = field(default=None, metadata=_flag("write one JSON line per step (docs/trace-schema.md)",
                                                                flag="--trace", metavar="FILE.jsonl"))

    def replace(self, **changes) -> GenerationConfig:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise GenerationError(f"unknown generation setting {sorted(unknown)[0]!r}")
        return dataclasses.replace(self, **changes)

    @property
    def traced(self) -> bool:
        return self.trace or self.trace_file is not None

    def sampling(self) -> SamplingParams:
        """The target's sampling distribution; greedy acceptance decodes greedily whatever the temperature."""
        return SamplingParams(0.0 if self.accept == "greedy" else float(self.temperature), int(self.top_k),
                              float(self.top_p))

    def rule(self) -> Rule:
        """The acceptance rule the run uses: `accept`'s, or greedy's at temperature 0, where typical
        and sample keep exactly the paths greedy keeps."""
        return RULES[self.accept] if self.sampling().temperature > 0 else RULES["greedy"]

    def validate(self) -> GenerationConfig:
        """Raise GenerationError naming the first bad setting; returns self."""
        if self.mode is not None and self.mode not in MODES:
            raise GenerationError(f"unknown mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.accept not in RULES:
            raise GenerationError(f"unknown acceptance {self.accept!r}; choose {', '.join(RULES)}")
        n = self.max_new_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, got {n!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise GenerationError(f"temperature must be >= 0 and finite, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise GenerationError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise GenerationError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (MIN_TOP_P <= p <= 1):
            raise GenerationError(f"top_p must be in (0, 1] and at least {MIN_TOP_P:.3g}, got {p!r}")
        for flag in ("stop_on_eos", "trace", "trace_heads", "text"):
            if not isinstance(getattr(self, flag), bool):
                raise GenerationError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.chat is not None and not isinstance(self.chat, bool):
            raise GenerationError(f"chat must be true, false or None (auto), got {self.chat!r}")
        if self.trace_file is not None and not isinstance(self.trace_file, (str, os.PathLike)):
            raise GenerationError(f"trace_file must be a path, got {self.trace_file!r}")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED):
            raise GenerationError(f"seed must be an integer in [0, 2**63 - 1], got {s!r}")
        return self
