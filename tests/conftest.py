"""Fixtures that write tiny random checkpoints to a temp dir (no network, no downloads)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
# One torch CPU thread in this process and every process it starts (app servers, CLI runs, TP ranks,
# notebook kernels): with two, each op waits at a barrier for its second thread, which a browser, a
# server, the other rank or another job on the machine holds off the cores for a time slice. On 2
# busy cores that made a 24-token demo run take 0.3-4.9 s instead of 0.2 s. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gc  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

VOCAB = 97


@pytest.fixture(autouse=True)
def thawed_heap():
    """A command run in this process freezes the heap after its load (engine/heap.py): each test
    leaves it unfrozen, so garbage cycles of later tests' engines are collected as usual."""
    yield
    gc.unfreeze()


QUICK = pytest.mark.gpu_quick  # the GPU set that fits a few minutes of one device call (-m gpu_quick)


DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def grid(*axes, quick=()) -> list:
    """Every combination of the axes as pytest params, for one parametrize over all the names (an axis
    whose values are tuples gives one name per element); the combinations listed flat in `quick` also
    belong to the gpu_quick set. (Marking one value of one axis would take in every combination
    holding it.) A `quick` entry that is no combination is an error: a typo would shrink the set unseen."""
    combos = [tuple(x for v in c for x in (v if isinstance(v, tuple) else (v,))) for c in itertools.product(*axes)]
    stray = [q for q in quick if q not in combos]
    if stray:
        raise ValueError(f"gpu_quick combinations not in the grid: {stray}")
    return [pytest.param(*c, marks=QUICK if c in quick else (), id="-".join(map(_param_id, c))) for c in combos]


def _param_id(value) -> str:
    """A value as a readable part of a test id (left to pytest, a dtype or tuple is only numbered: dtype78)."""
    if isinstance(value, tuple):
        return "_".join(map(str, value))
    return DTYPE_IDS.get(value, str(value)) if isinstance(value, torch.dtype) else str(value)


def make_hf_model(path, kind: str = "llama", n_kv: int = 2, tied: bool = False, seed: int = 0, ctx: int = 256):
    """Save a tiny random HF model of the given layout; returns the transformers model (eval)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=n_kv, max_position_embeddings=ctx,
                  tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if kind == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif kind == "mistral":
        cfg, cls = transformers.MistralConfig(**common, sliding_window=None), transformers.MistralForCausalLM
    elif kind == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        raise ValueError(kind)
    model = cls(cfg).eval()
    with torch.no_grad():  # larger than default init, so greedy outputs vary and heads matter
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(str(path))
    return model


def random_heads_sd(num_heads: int = 5, num_layers: int = 1, dim: int = 64, vocab: int | None = VOCAB, seed: int = 1):
    """A FasterDecoding-layout state dict ({h}.{l}.linear.*, {h}.{L}.weight when vocab is given)."""
    from engine.heads import MedusaHeads

    g = torch.Generator().manual_seed(seed)
    h = MedusaHeads(num_heads, num_layers, dim, vocab)
    with torch.no_grad():
        h.weight.copy_(torch.randn(h.weight.shape, generator=g) * 0.05)
        h.bias.copy_(torch.randn(h.bias.shape, generator=g) * 0.05)
        if h.proj is not None:
            h.proj.copy_(torch.randn(h.proj.shape, generator=g) * 0.3)
    return h.state_dict_faster_decoding()


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    make_hf_model(d, "llama", n_kv=2, tied=False)
    from safetensors.torch import save_file

    save_file(random_heads_sd(), str(d / "medusa_lm_head.safetensors"))
    # public Medusa configs state the head count wrongly; the loader must ignore it
    (d / "config_medusa.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    return d


@pytest.fixture(scope="session")
def demo_engine():
    import engine

    return engine.load("demo", device="cpu")


def oracle_heads(eng, prompts: list[list[int]], max_new: int, num_heads: int = 5, rank=lambda p, k: 0):
    """Oracle drafts (engine/bench/oracle.py) for these prompts' greedy AR continuations on `eng`: head k
    proposes the token AR writes k+2 places after each position at rank `rank(output index, k)`. Full-
    depth paths and non-first-child compaction then happen on every layout and tree; the draft is right
    exactly when the engine's hidden state (its KV cache included) is."""
    from engine.bench.oracle import oracle_for

    seqs = [ids + eng.generate(ids, max_new, mode="ar").token_ids for ids in prompts]
    return oracle_for(eng.model, seqs, [len(ids) for ids in prompts], num_heads, lambda _, s, k: rank(s, k))


def oracle_steps(tree: list[list[int]], n_tokens: int, num_heads: int, rank) -> int:
    """Steps a greedy Medusa run of `tree` must take over n_tokens outputs under OracleHeads(rank):
    at output index s the rank vector is [rank(s, k) for heads whose target exists]; the tree keeps
    its longest path that is a prefix of it."""
    nodes = {tuple(p) for p in tree}
    s = steps = 0
    while s < n_tokens:
        vec = [rank(s, k) for k in range(num_heads) if s + 1 + k < n_tokens]
        keep = 0
        while keep < len(vec) and tuple(vec[: keep + 1]) in nodes:
            keep += 1
        s, steps = s + 1 + keep, steps + 1
    return steps


def ar_run(vectors, probs=None, topk: int = 3):
    """A trees.Run of one AR step per rank vector in `vectors`, its heads' top-k made to match (a rank
    names exactly one token: the stream's tokens are distinct); probs[i][k]: head k's top-k
    probabilities at step i (None: not recorded)."""
    import trees

    n = len(vectors)
    stream = list(range(100, 100 + n))
    heads = []
    for i, v in enumerate(vectors):
        step = []
        for k, r in enumerate(v):
            top = [-1 - j for j in range(topk)]
            if r is not None and i + 1 + k < n:
                top[r] = stream[i + 1 + k]
            step.append(top)
        heads.append(step)
    head_probs = probs or [[[None] * topk for _ in v] for v in vectors]
    return trees.Run(header={"mode": "ar"}, tokens=[[t] for t in stream], head_tokens=heads, head_probs=head_probs,
                     accepted=[1] * n)


def random_ar_runs(seed: int, n_runs: int = 12, length: int = 60, heads: int = 3, probs: bool = False):
    """AR runs of random rank vectors over top-3 candidates; heads are correlated (after a miss, later
    heads miss more often). probs=True: each step's heads carry top-3 probabilities that put their
    mass on the right rank and those above it (as real heads tend to), so a tree drafted from them per
    step can beat a fixed one."""
    g = torch.Generator().manual_seed(seed)
    runs = []
    for _ in range(n_runs):
        vec, prob = [], []
        for _i in range(length):
            v, p = [], []
            for _k in range(heads):
                r = int(torch.randint(0, 5, (1,), generator=g))
                v.append(None if r >= 3 or (v and v[-1] is None and r > 0) else r)
                u = torch.rand(3, generator=g).tolist()
                # the right rank and those above it get most of the mass (none right: a flat, low head)
                share = {0: 0.6 + 0.35 * u[0], 1: 0.7, 2: 0.8, None: 0.3}[v[-1]]
                ranks = 1 if v[-1] is None else v[-1] + 1
                p.append(sorted([share / ranks * (0.9 + 0.1 * x) for x in u[:ranks]] +
                                [0.02 * x for x in u[ranks:]], reverse=True))
            vec.append(v)
            prob.append(p)
        runs.append(ar_run(vec, prob if probs else None))
    return runs


def write_ar_trace(path, runs, header: dict | None = None) -> None:
    """A trace file (docs/trace-schema.md) of trees.Runs: a header per run, one line per step with
    the heads' top-k ids and probabilities."""
    with open(path, "w") as f:
        for run in runs:
            f.write(json.dumps({"type": "header", "schema_version": 1, "mode": "ar", **(header or {})}) + "\n")
            for i, (tokens, ids, probs) in enumerate(zip(run.tokens, run.head_tokens, run.head_probs)):
                head_topk = [[{"token": t, "text": "", "prob": p} for t, p in zip(h, ph)] for h, ph in zip(ids, probs)]
                f.write(json.dumps({"step": i, "accepted_tokens": tokens, "accepted_nodes": [0],
                                    "head_topk": head_topk}) + "\n")


def tabs_of(wb):
    """Every tab of the app over one Workbench, and the named API, as the app builds them."""
    from types import SimpleNamespace

    from workbench.api import Api
    from workbench.tabs import tab_classes

    t = SimpleNamespace(**{cls.__module__.rsplit(".", 1)[1]: cls(wb) for cls in tab_classes()})
    t.api = Api(t.decode, t.editor, t.tune)
    return t


@pytest.fixture(scope="module")
def wb(demo_engine, tmp_path_factory, request):
    """A workbench over the demo engine with its own data folder, one per test module."""
    from engine.loading import DEMO_DIR
    from workbench.core import Workbench

    return Workbench(demo_engine, tmp_path_factory.mktemp(request.module.__name__), DEMO_DIR / "tune_traces.jsonl")


@pytest.fixture(scope="module")
def tabs(wb):
    """Every tab and the named API over the module's workbench."""
    return tabs_of(wb)
