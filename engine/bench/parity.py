"""bench --part parity: our greedy output against `transformers`' greedy output on the same weights.

Prompt by prompt, token for token. Where the two differ, the first differing position is judged by a
float32 `transformers` run of the common prefix: the logit margin between the token we chose and the
one transformers chose, next to the spacing of representable values (ulp) at that logit's magnitude
in the run's dtype. A margin within a few ulps is a near-tie that rounding decides (different kernels
sum in different orders); a larger one would be a bug. In float32 every output should be equal.
"""

from __future__ import annotations

import math

import torch

NEAR_TIE_ULPS = 4  # the two kernels' roundings can each move a logit by about an ulp, over several layers


def ulp(value: float, dtype: torch.dtype) -> float:
    """Spacing of representable numbers of `dtype` at |value|."""
    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]  # significand bits incl. the implicit one
    exp = math.floor(math.log2(max(abs(value), 1e-30)))
    return 2.0 ** (exp - bits + 1)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_parity(eng, prompts: list[list[int]], max_new: int, stop_on_eos: bool) -> dict:
    from transformers import AutoModelForCausalLM

    from ..generation import GenerationConfig

    dtype = eng.model.embed_tokens.weight.dtype
    path = str(eng.model_dir)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).to(eng.device).eval()
    judge = hf if dtype == torch.float32 else \
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).to(eng.device).eval()
    eos = sorted(eng.eos_ids) if stop_on_eos else None
    cfg = GenerationConfig(mode="ar", max_new_tokens=max_new, stop_on_eos=stop_on_eos, chat=False)
    rows = []
    for n, ids in enumerate(prompts):
        ours = eng.generate(ids, config=cfg).token_ids
        with torch.inference_mode():
            y = hf.generate(torch.tensor([ids], device=eng.device), max_new_tokens=max_new, do_sample=False,
                            eos_token_id=eos, min_new_tokens=None if stop_on_eos else max_new, pad_token_id=0)
        theirs = y[0, len(ids):].tolist()
        i = first_difference(ours, theirs)
        row = {"prompt": n, "tokens": len(ours), "identical": i is None}
        if i is not None and i < min(len(ours), len(theirs)):
            with torch.inference_mode():
                logits = judge(torch.tensor([ids + ours[:i]], device=eng.device)).logits[0, -1].float()
            a, b = ours[i], theirs[i]
            margin = float(logits[a] - logits[b])
            spacing = ulp(float(logits.max()), dtype)
            row.update({"first_difference": i, "ours": a, "theirs": b, "fp32_margin": round(margin, 6),
                        "ulp": spacing, "margin_in_ulps": round(abs(margin) / spacing, 2),
                        "near_tie": abs(margin) <= NEAR_TIE_ULPS * spacing,
                        "fp32_prefers": "ours" if margin > 0 else "theirs" if margin < 0 else "tie"})
        elif i is not None:
            row.update({"first_difference": i, "note": "one output stopped earlier (EOS)"})
        rows.append(row)
    diverged = [r for r in rows if not r["identical"]]
    return {"dtype": str(dtype).removeprefix("torch."), "identical": len(rows) - len(diverged), "of": len(rows),
            "divergences_near_tie": sum(bool(r.get("near_tie")) for r in diverged),
            "divergences_not_near_tie": sum(not r.get("near_tie") for r in diverged), "near_tie_ulps": NEAR_TIE_ULPS,
            "per_prompt": rows}
