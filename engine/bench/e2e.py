"""bench --part e2e: tokens/s and tokens/step of our AR, Medusa with each tree, and `transformers`
generate on the same prompts, timed round-robin; greedy Medusa output checked equal to AR's."""

from __future__ import annotations

from ..generation import GenerationConfig
from .common import device_sync, engine_runner, ratio, round_robin, warm_up


def agreement(outs: list[list[int]], ref: list[list[int]]) -> dict:
    """How many outputs equal the reference's, and where each other one first differs (greedy outputs
    can differ in bf16, where kernels of other shapes round near-tied logits the other way)."""
    firsts = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
              for o, r in zip(outs, ref) if o != r]
    return {"identical": len(outs) - len(firsts), "of": len(outs), "first_divergence_at": firsts}


def distinct_ngram_ratio(ids: list[int], n: int) -> float:
    """Distinct n-grams over all n-grams of a token list (1.0: no n-gram repeats); needs >= n tokens."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams)


def transformers_runner(eng, max_new: int, stop_on_eos: bool):
    """The peer: `transformers` greedy generate on the same weights, device and dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(eng.model_dir), dtype=eng.model.embed_tokens.weight.dtype,
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


def summarise(res: dict[str, dict], eng, tree_names: list[str], greedy: bool = True) -> dict:
    """The JSON of a round-robin run: our AR, each tree (speedups with intervals over rounds, output
    agreement with AR), `transformers` and traced runs when they ran."""
    ar = res["ar"]
    out: dict = {"ar": {k: v for k, v in ar.items() if k != "outputs"}, "medusa": {}}
    t = res.get("transformers")
    if t is not None:
        out["transformers"] = {k: v for k, v in t.items() if k not in ("outputs", "steps", "tokens_per_step")}
        out["transformers"]["greedy_output_equals_ours_ar"] = t["outputs"] == ar["outputs"]
        out["transformers"]["agreement_with_ours_ar"] = agreement(t["outputs"], ar["outputs"])
        out["ar"]["speedup_vs_transformers"] = ratio(ar, t)
    for name in tree_names:
        m = res[f"medusa:{name}"]
        row = {k: v for k, v in m.items() if k != "outputs"}
        row["nodes"] = len(eng.resolve_tree(name))
        row["speedup_vs_ar"] = ratio(m, ar)
        if t is not None:
            row["speedup_vs_transformers"] = ratio(m, t)
        row["greedy_output_equals_ar"] = m["outputs"] == ar["outputs"] if greedy else None
        row["agreement_with_ar"] = agreement(m["outputs"], ar["outputs"])
        out["medusa"][name] = row
    # "ar" traced runs the heads for their top-k, which untraced AR does not; "ar without heads" is the
    # target's trace alone (GenerationConfig.trace_heads)
    pairs = {name: (name, f"{name} traced") for name in ["ar"] + [f"medusa:{n}" for n in tree_names]}
    pairs["ar without heads"] = ("ar", "ar traced without heads")
    traced = {name: {"tokens_per_s": res[key]["tokens_per_s"], "untraced_over_traced": ratio(res[base], res[key]),
                     "same_output": res[key]["outputs"] == res[base]["outputs"], "gc": res[key]["gc"]}
              for name, (base, key) in pairs.items() if key in res}
    if traced:
        out["traced"] = traced
    if eng.model.gemm_choice is not None:  # what `--gemm auto` timed and chose (`skinny` times nothing)
        out["gemm_choice"] = eng.model.gemm_choice.chosen()
    return out


def judge_medusa_divergences(eng, prompts: list[list[int]], res: dict, tree_names: list[str], out: dict) -> None:
    """Greedy Medusa must equal greedy AR. In float32 it does; in bf16 the tree step's kernels (other
    shapes, other summation orders) can flip a near-tied argmax. Each prompt whose Medusa output differs
    from AR's is judged at its first difference by a float32 `transformers` run (bench/parity.py): a
    margin of a few ulps is rounding, a larger one a bug. Adds `divergences_vs_ar` to each tree's row
    ("ours" is Medusa's token, "theirs" AR's)."""
    from .parity import divergence_summary, fp32_reference, judge_difference

    ar = res["ar"]["outputs"]
    if all(res[f"medusa:{n}"]["outputs"] == ar for n in tree_names):
        return
    judge = fp32_reference(eng)
    dtype = eng.model.embed_tokens.weight.dtype
    for name in tree_names:
        rows = []
        for n, (ids, med, ref) in enumerate(zip(prompts, res[f"medusa:{name}"]["outputs"], ar)):
            judged = judge_difference(judge, ids, med, ref, dtype)
            rows.append({"prompt": n, "identical": not judged, **judged})
        out["medusa"][name]["divergences_vs_ar"] = {**divergence_summary(rows),
                                                    "per_prompt": [r for r in rows if not r["identical"]]}


def run_e2e(eng, prompts: list[list[int]], cfg: GenerationConfig, tree_names: list[str], rounds: int,
            with_transformers: bool = True, traced: bool = False) -> dict:
    ar_cfg = cfg.replace(mode="ar")
    runners = {"ar": engine_runner(eng, ar_cfg)}
    for name in tree_names:
        runners[f"medusa:{name}"] = engine_runner(eng, cfg.replace(mode="medusa", tree=name))
    if traced:  # what the workbench runs: every step traced (gathered on the device, one copy per step)
        runners["ar traced"] = engine_runner(eng, ar_cfg.replace(trace=True, trace_heads=True))
        runners["ar traced without heads"] = engine_runner(eng, ar_cfg.replace(trace=True, trace_heads=False))
        for name in tree_names:
            runners[f"medusa:{name} traced"] = engine_runner(eng, cfg.replace(mode="medusa", tree=name, trace=True))
    if with_transformers:
        runners["transformers"] = transformers_runner(eng, cfg.max_new_tokens, cfg.stop_on_eos)
    warm_up(runners, prompts)
    res = round_robin(runners, prompts, rounds, device_sync(eng))
    out = {"rounds": rounds, **summarise(res, eng, tree_names, cfg.accept == "greedy")}
    if cfg.accept == "greedy":
        judge_medusa_divergences(eng, prompts, res, tree_names, out)
    ratios = [distinct_ngram_ratio(o, 4) for o in res["ar"]["outputs"] if len(o) >= 4]
    out["ar"]["distinct_4gram_ratio"] = round(sum(ratios) / len(ratios), 3) if ratios else None
    return out


def run_e2e_shape(shape: str, tree_names: list[str], prompts: int, prompt_len: int, max_new: int, rounds: int,
                  backend: str, gemm: str = "cublas", dtype: str = "bfloat16", device: str = "cuda") -> dict:
    """The engine end to end on a random-weight model of a real shape with oracle drafts
    (`oracle.oracle_engine`), with `transformers` generate on the same weights as the peer."""
    import torch

    from .oracle import oracle_engine

    hf, eng, ids, about = oracle_engine(shape, prompts, prompt_len, max_new, backend, gemm, dtype, device)
    cfg = GenerationConfig(max_new_tokens=max_new, mode="ar", stop_on_eos=False)

    def hf_run(p):
        x = torch.tensor([p], device=device)
        with torch.inference_mode():
            y = hf.generate(x, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, pad_token_id=0)
        out = y[0, len(p):].tolist()
        return out, len(out)

    runners = {"ar": engine_runner(eng, cfg)}
    runners |= {f"medusa:{t}": engine_runner(eng, cfg.replace(mode="medusa", tree=t)) for t in tree_names}
    runners["ar traced"] = engine_runner(eng, cfg.replace(trace=True))
    runners[f"medusa:{tree_names[-1]} traced"] = engine_runner(eng, cfg.replace(mode="medusa", tree=tree_names[-1],
                                                                                trace=True))
    runners["transformers"] = hf_run
    warm_up(runners, ids)
    res = round_robin(runners, ids, rounds, device_sync(eng))
    return {**about, "rounds": rounds, **summarise(res, eng, tree_names)}
