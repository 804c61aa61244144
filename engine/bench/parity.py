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


def fp32_reference(eng):
    """`transformers`' float32 model of the engine's weights: the judge of near-ties (an independent
    implementation, in a dtype where the kernels' summation orders no longer decide the argmax)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(eng.model_dir), dtype=torch.float32,
                                                local_files_only=True).to(eng.device).eval()


def judge_difference(judge, ids: list[int], ours: list[int], theirs: list[int], dtype: torch.dtype) -> dict:
    """Where two greedy outputs of one prompt first differ, and whether that is a near-tie: the float32
    logit margin between the two chosen tokens after the common prefix, in ulps of the run's dtype."""
    i = first_difference(ours, theirs)
    if i is None:
        return {}
    if i >= min(len(ours), len(theirs)):
        return {"first_difference": i, "note": "one output stopped earlier (EOS)"}
    with torch.inference_mode():
        logits = judge(torch.tensor([ids + ours[:i]], device=judge.device)).logits[0, -1].float()
    a, b = ours[i], theirs[i]
    margin = float(logits[a] - logits[b])
    spacing = ulp(float(logits.max()), dtype)
    return {"first_difference": i, "ours": a, "theirs": b, "fp32_margin": round(margin, 6), "ulp": spacing,
            "margin_in_ulps": round(abs(margin) / spacing, 2), "near_tie": abs(margin) <= NEAR_TIE_ULPS * spacing,
            "fp32_prefers": "ours" if margin > 0 else "theirs" if margin < 0 else "tie"}


def divergence_summary(rows: list[dict]) -> dict:
    """Counts of a list of per-prompt rows (each with `identical`, and judge_difference's fields)."""
    diverged = [r for r in rows if not r["identical"]]
    return {"identical": len(rows) - len(diverged), "of": len(rows),
            "divergences_near_tie": sum(bool(r.get("near_tie")) for r in diverged),
            "divergences_not_near_tie": sum(not r.get("near_tie") for r in diverged), "near_tie_ulps": NEAR_TIE_ULPS}


def run_parity(eng, prompts: list[list[int]], max_new: int, stop_on_eos: bool) -> dict:
    from transformers import AutoModelForCausalLM

    from ..generation import GenerationConfig

    dtype = eng.model.embed_tokens.weight.dtype
    hf = AutoModelForCausalLM.from_pretrained(str(eng.model_dir), dtype=dtype, local_files_only=True).to(eng.device).eval()
    judge = hf if dtype == torch.float32 else fp32_reference(eng)
    eos = sorted(eng.eos_ids) if stop_on_eos else None
    cfg = GenerationConfig(mode="ar", max_new_tokens=max_new, stop_on_eos=stop_on_eos, chat=False)
    rows = []
    for n, ids in enumerate(prompts):
        ours = eng.generate(ids, config=cfg).token_ids
        with torch.inference_mode():
            y = hf.generate(torch.tensor([ids], device=eng.device), max_new_tokens=max_new, do_sample=False,
                            eos_token_id=eos, min_new_tokens=None if stop_on_eos else max_new, pad_token_id=0)
        theirs = y[0, len(ids):].tolist()
        judged = judge_difference(judge, ids, ours, theirs, dtype)
        rows.append({"prompt": n, "tokens": len(ours), "identical": not judged, **judged})
    return {"dtype": str(dtype).removeprefix("torch."), **divergence_summary(rows), "per_prompt": rows}
