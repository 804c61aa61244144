"""bench --part e2e: tokens/s and tokens/step of our AR, Medusa with each tree, and `transformers`
generate on the same prompts, timed round-robin; greedy Medusa output checked equal to AR's."""

from __future__ import annotations

from ..generation import GenerationConfig
from .common import ratio, round_robin


def distinct_ngram_ratio(ids: list[int], n: int) -> float:
    """Distinct n-grams over all n-grams of a token list (1.0: no n-gram repeats); needs >= n tokens."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams)


def transformers_runner(eng, model: str, max_new: int, stop_on_eos: bool):
    """The peer: `transformers` greedy generate on the same weights, device and dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..loading import resolve_model_dir

    hf = AutoModelForCausalLM.from_pretrained(str(resolve_model_dir(model)), dtype=eng.model.embed_tokens.weight.dtype,
                                              local_files_only=True).to(eng.device).eval()
    eos = sorted(eng.eos_ids) if stop_on_eos else None

    def run(ids):
        x = torch.tensor([ids], device=eng.device)
        with torch.inference_mode():
            y = hf.generate(x, max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                            min_new_tokens=None if stop_on_eos else max_new, pad_token_id=0)
        out = y[0, len(ids):].tolist()
        return out, len(out)

    return run


def run_e2e(eng, model: str, prompts: list[list[int]], cfg: GenerationConfig, tree_names: list[str], rounds: int,
            with_transformers: bool = True) -> dict:
    def runner(c: GenerationConfig):
        def run(ids):
            r = eng.generate(ids, config=c)
            return r.token_ids, r.steps
        return run

    ar_cfg = cfg.replace(mode="ar")
    runners = {"ar": runner(ar_cfg)}
    for name in tree_names:
        runners[f"medusa:{name}"] = runner(cfg.replace(mode="medusa", tree=name))
    if with_transformers:
        runners["transformers"] = transformers_runner(eng, model, cfg.max_new_tokens, cfg.stop_on_eos)
    for run in runners.values():  # warm-up: compile, capture graphs, fill caches
        for ids in prompts[:2]:
            run(ids)
    sync = (lambda: __import__("torch").cuda.synchronize()) if eng.device.type == "cuda" else (lambda: None)
    res = round_robin(runners, prompts, rounds, sync)
    ar = res["ar"]
    ratios = [distinct_ngram_ratio(o, 4) for o in ar["outputs"] if len(o) >= 4]
    out = {"rounds": rounds, "ar": {k: v for k, v in ar.items() if k != "outputs"}, "medusa": {}}
    out["ar"]["distinct_4gram_ratio"] = round(sum(ratios) / len(ratios), 3) if ratios else None
    if with_transformers:
        t = res["transformers"]
        out["transformers"] = {k: v for k, v in t.items() if k not in ("outputs", "steps", "tokens_per_step")}
        out["transformers"]["greedy_output_equals_ours_ar"] = t["outputs"] == ar["outputs"]
        out["ar"]["speedup_vs_transformers"] = ratio(ar, t)
    for name in tree_names:
        m = res[f"medusa:{name}"]
        row = {k: v for k, v in m.items() if k != "outputs"}
        row["nodes"] = len(eng.resolve_tree(name))
        row["speedup_vs_ar"] = ratio(m, ar)
        if with_transformers:
            row["speedup_vs_transformers"] = ratio(m, res["transformers"])
        row["greedy_output_equals_ar"] = m["outputs"] == ar["outputs"] if cfg.accept == "greedy" else None
        out["medusa"][name] = row
    return out
