"""`engine.load(...) -> Engine`: one model, its heads and tokenizer, and the generate/stream API."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

import trees

from .config import ModelLoadError
from .decode import DecodeState, ar_step, prefill, tree_step
from .graphs import StepGraphs
from .heads import MedusaHeads
from .loading import find_heads, load_base, load_heads, resolve_model_dir
from .model import Transformer
from .sampling import SamplingParams
from .tp import SINGLE, TP
from .trace import TraceWriter, header, step_trace

MODES = ("ar", "medusa")
MAX_TREE_NODES = 512  # candidates verified per step; beyond this a step costs more than it can win


class GenerationError(ValueError):
    """Bad generation settings or input (too long, empty, unknown mode); nothing was run."""


@dataclass
class StepEvent:
    step: int
    tokens: list[int]
    text: str  # text this step added to the output
    accepted_nodes: list[int]
    step_ms: float
    trace: dict | None
    done: bool = False
    finish_reason: str | None = None  # "eos" | "length" on the last event


@dataclass
class Result:
    text: str
    token_ids: list[int]
    new_tokens: int
    steps: int
    mean_accepted: float
    wall_s: float
    tokens_per_s: float
    mode: str
    tree: list[list[int]] | None
    prompt_tokens: int
    finish_reason: str
    traces: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        keys = ("text", "token_ids", "new_tokens", "steps", "mean_accepted", "wall_s", "tokens_per_s", "mode", "tree",
                "prompt_tokens", "finish_reason")
        return {k: getattr(self, k) for k in keys}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(names)}")
    return names[dtype]


class Engine:
    def __init__(self, model: Transformer, heads: MedusaHeads | None, tokenizer, name: str, heads_source: str | None,
                 max_seq_len: int | None = None, cuda_graphs: bool | None = None):
        self.model, self.heads, self.tokenizer = model, heads, tokenizer
        on_cuda = model.embed_tokens.weight.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ModelLoadError("cuda_graphs needs a CUDA device")
        # greedy steps replay captured CUDA graphs (engine/graphs.py); on by default on CUDA
        self.graphs = StepGraphs(model) if (on_cuda if cuda_graphs is None else cuda_graphs) else None
        model.fused = self.graphs is not None  # and pointwise ops fused (engine/fused.py)
        if self.graphs is not None:
            model.fuse_projections()
        self.name, self.heads_source = name, heads_source
        self.args = model.args
        context = self.args.max_position_embeddings
        if self.args.sliding_window:
            context = min(context, self.args.sliding_window)  # beyond the window our attention would differ
        self.max_seq_len = min(max_seq_len or context, context)
        self.topk = min(10, self.args.vocab_size)  # candidates per head (a tiny vocabulary has fewer)
        eos = set(self.args.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = eos

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads if self.heads is not None else 0

    # -- input ---------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise GenerationError("this model has no tokenizer: pass token ids")
            if chat and getattr(self.tokenizer, "chat_template", None):
                ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                         add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            else:
                ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise GenerationError("the prompt is empty (no tokens)")
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < self.args.vocab_size)]
        if bad:
            raise GenerationError(f"token id {bad[0]!r} is outside the vocabulary [0, {self.args.vocab_size})")
        return [int(t) for t in ids]

    def decode_token(self, token: int) -> str:
        return self.tokenizer.decode([token]) if self.tokenizer is not None else f"<{token}>"

    def text_of(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def resolve_tree(self, tree) -> list[list[int]]:
        if self.heads is None:
            raise GenerationError("mode 'medusa' needs Medusa heads; this engine was loaded without any")
        try:
            choices = trees.resolve(tree, topk=self.topk, num_heads=self.num_heads)
        except trees.TreeError as e:
            raise GenerationError(f"bad tree: {e}") from None
        if len(choices) + 1 > MAX_TREE_NODES:
            raise GenerationError(f"bad tree: {len(choices)} nodes; the engine verifies at most {MAX_TREE_NODES - 1} per step")
        return choices

    def check_cache_fits(self, batch: int, capacity: int) -> None:
        """Refuse a KV cache that cannot fit before allocating it: a CPU allocation that overcommits
        is killed by the OS later, not refused, so asking the allocator is not enough."""
        a = self.args
        elt = self.model.embed_tokens.weight.element_size()
        need = 2 * a.n_layers * batch * (a.n_kv_heads // self.model.tp.world) * capacity * a.head_dim * elt
        held = self.model.cache.k.numel() * 2 * elt if self.model.cache is not None else 0
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0] + held
        else:
            free = available_memory() + held
        if need > 0.9 * free:
            raise GenerationError(f"out of memory: a KV cache for {batch} x {capacity} tokens needs {need / 2**30:.2f} GiB; "
                                  f"{free / 2**30:.2f} GiB is free")

    # -- decoding ------------------------------------------------------------------------------
    def stream(
        self,
        prompt_or_ids: str | Sequence[int],
        max_new_tokens: int = 128,
        mode: str = "medusa",
        tree=None,
        accept: str = "greedy",
        trace: bool = False,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        chat: bool = False,
        stop_on_eos: bool = True,
        trace_file: str | os.PathLike | None = None,
    ) -> Iterator[StepEvent]:
        """Yield one StepEvent per decoding step (the UI draws each as it arrives)."""
        for events in self._steps([prompt_or_ids], max_new_tokens, mode, tree, accept, trace, temperature, top_k,
                                  top_p, seed, chat, stop_on_eos, trace_file):
            yield events[0][1]

    def _steps(self, prompts, max_new, mode, tree, accept, trace, temperature=0.0, top_k=0, top_p=1.0, seed=None,
               chat=False, stop_on_eos=True, trace_file=None) -> Iterator[list[tuple[int, StepEvent]]]:
        """Validate everything, then decode all prompts as one batch: each step yields the event of
        every request still running, as (request index, event); finished requests leave the batch."""
        if mode not in MODES:
            raise GenerationError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        if accept not in ("greedy", "typical", "sample"):
            raise GenerationError(f"unknown acceptance {accept!r}; choose greedy, typical or sample")
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, got {max_new!r}")
        try:
            params = SamplingParams(0.0 if accept == "greedy" else float(temperature), int(top_k), float(top_p))
        except ValueError as e:
            raise GenerationError(str(e)) from None
        choices = self.resolve_tree(tree) if mode == "medusa" else None
        tree_nodes = len(choices) + 1 if choices else 1
        self.check_cache_fits(len(prompts), self.max_seq_len + tree_nodes)
        batch = [self.encode(p, chat=chat) for p in prompts]
        for r, ids in enumerate(batch):
            if len(ids) + max_new > self.max_seq_len:
                which = f"prompt {r}" if len(batch) > 1 else "prompt"
                raise GenerationError(
                    f"{which} of {len(ids)} tokens + max_new_tokens {max_new} = {len(ids) + max_new} "
                    f"exceeds the context of {self.max_seq_len} tokens"
                )
        buf = trees.buffers(choices, topk=self.topk).to(self.device) if choices else None
        try:
            self.model.setup_cache(len(batch), self.max_seq_len + tree_nodes)
        except torch.OutOfMemoryError:
            self.model.cache = None
            raise GenerationError(f"out of memory allocating a KV cache of {len(batch)} x {self.max_seq_len} tokens") from None
        gen = None
        if seed is not None or not params.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.model.tp.shared_seed(seed if seed is not None else int(time.time_ns() % 2**31)))
        writer = TraceWriter(trace_file) if trace_file else None
        want_trace = trace or writer is not None
        if writer:
            writer.write(header(self.name, self.heads_source, choices, mode, accept,
                                {"temperature": params.temperature, "prompt_tokens": [len(i) for i in batch]
                                 if len(batch) > 1 else len(batch[0])}))
        try:
            yield from self._loop(batch, max_new, mode, buf, choices, accept, params, gen, want_trace, writer,
                                  stop_on_eos)
        finally:
            if writer:
                writer.close()

    def _loop(self, batch, max_new, mode, buf, choices, accept, params, gen, want_trace, writer, stop_on_eos):
        """Decode until every request has finished. `rows` is the request of each batch row on the
        device; finished requests leave it once no step is in flight. With CUDA graphs and no
        traces, step N+1 is queued before step N's tokens are read (StepGraphs.launch), unless a
        request may finish at step N: the host's work then overlaps the GPU's."""
        sync = self.device.type == "cuda"
        with_heads = self.heads if (mode == "medusa" or want_trace) else None
        state: DecodeState = prefill(self.model, with_heads, batch, params, gen)
        rows = list(range(len(batch)))
        running = set(rows)
        produced: list[list[int]] = [[] for _ in batch]
        parent = buf.parent.tolist() if mode == "medusa" else [-1]
        graphs = self.graphs if self.graphs and StepGraphs.usable(self.model, accept, params, mode) else None
        graph_heads = self.heads if mode == "medusa" else with_heads
        per_step = buf.retrieve_indices.shape[1] if mode == "medusa" else 1  # most tokens one step can commit
        queued = None  # a launched step not yet read, and the rows it ran for
        step = 0
        try:
            while running:
                t0 = time.perf_counter()
                prefix_lens = list(state.host_lengths)
                if graphs is not None:
                    if queued is None:
                        queued = graphs.launch(graph_heads, buf, choices, state), list(rows)
                    current, step_rows = queued
                    queued = None
                    may_finish = any(max_new - len(produced[r]) <= per_step for r in running)
                    if not want_trace and set(rows) == running and not may_finish:
                        queued = graphs.launch(graph_heads, buf, choices, state), list(rows)
                    results = graphs.collect(current, state)
                else:
                    step_rows = list(rows)
                    if mode == "medusa":
                        results = tree_step(self.model, self.heads, buf, state, accept, params, gen)
                    else:
                        results = ar_step(self.model, with_heads, state, params, gen)
                    if sync:
                        torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1000
                events = []
                for row, (req, res) in enumerate(zip(step_rows, results)):
                    if req not in running:  # finished before this (queued) step: its tokens are not output
                        continue
                    out = produced[req]
                    tokens = res.tokens[: max_new - len(out)]
                    finish = None
                    if stop_on_eos:
                        for i, t in enumerate(tokens):
                            if t in self.eos_ids:
                                tokens, finish = tokens[: i + 1], "eos"
                                break
                    res.tokens = tokens  # what is committed to the output (cut at EOS / max_new_tokens)
                    before = self.text_of(out)
                    out.extend(tokens)
                    if finish is None and len(out) >= max_new:
                        finish = "length"
                    record = None
                    if want_trace:
                        record = step_trace(step, prefix_lens[row], choices or [], res, parent, self.topk, ms,
                                            self.decode_token)
                        if len(batch) > 1:
                            record["request"] = req
                        if writer:
                            writer.write(record)
                    text = self.text_of(out)
                    events.append((req, StepEvent(step, tokens, text[len(before):] if text.startswith(before) else text,
                                                  res.accepted_nodes, ms, record, finish is not None, finish)))
                    if finish is not None:
                        running.discard(req)
                yield events
                step += 1
                if queued is None and running and len(running) < len(rows):  # finished requests leave the batch
                    keep = [i for i, req in enumerate(rows) if req in running]
                    rows = [rows[i] for i in keep]
                    state.keep(keep)
                    self.model.cache.keep_rows(torch.tensor(keep, device=self.device))
        finally:
            if queued is not None:  # a step queued past the end (EOS) or before the caller stopped
                queued[0].done.synchronize()

    def generate(self, prompt_or_ids, max_new_tokens: int = 128, mode: str = "medusa", tree=None,
                 accept: str = "greedy", trace: bool = False, **kw) -> Result | list[Result]:
        """One prompt (text or token ids) -> Result; a list of prompts (texts or id lists) -> one
        Result per prompt, decoded together as a batch."""
        batched = isinstance(prompt_or_ids, (list, tuple)) and bool(prompt_or_ids) and \
            all(isinstance(p, (str, list, tuple)) for p in prompt_or_ids)
        prompts = list(prompt_or_ids) if batched else [prompt_or_ids]
        t0 = time.perf_counter()
        per_request: list[list[StepEvent]] = [[] for _ in prompts]
        for events in self._steps(prompts, max_new_tokens, mode, tree, accept, trace, **kw):
            for req, ev in events:
                per_request[req].append(ev)
        wall = time.perf_counter() - t0
        choices = self.resolve_tree(tree) if mode == "medusa" else None
        results = []
        for p, evs in zip(prompts, per_request):
            token_ids = [t for e in evs for t in e.tokens]
            results.append(Result(
                text=self.text_of(token_ids),
                token_ids=token_ids,
                new_tokens=len(token_ids),
                steps=len(evs),
                mean_accepted=len(token_ids) / max(len(evs), 1),
                wall_s=wall,
                tokens_per_s=len(token_ids) / wall if wall > 0 else 0.0,
                mode=mode,
                tree=choices,
                prompt_tokens=len(self.encode(p, chat=kw.get("chat", False))),
                finish_reason=evs[-1].finish_reason if evs else "length",
                traces=[e.trace for e in evs if e.trace is not None],
            ))
        return results if batched else results[0]


def available_memory() -> int:
    """Bytes of memory the OS can still give this process (Linux MemAvailable; else a page count)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def load_tokenizer(model_dir: Path):
    files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any((model_dir / f).exists() for f in files):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"{model_dir}: cannot load the tokenizer ({type(e).__name__}: {e})") from None


def load(
    model: str | os.PathLike,
    heads: str | os.PathLike | dict | bool | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_seq_len: int | None = None,
    backend: str = "sdpa",
    tp: TP = SINGLE,
    cuda_graphs: bool | None = None,
) -> Engine:
    """Load a local Llama-family model and its Medusa heads.

    heads=None finds them beside the model (medusa_heads.safetensors, medusa_lm_head.*, or
    `medusa_head.*` keys in a Medusa-2 checkpoint); heads=False loads none; a path loads that file.
    tp: this process's place in a tensor-parallel group (`engine.tp.init_from_env`); every rank
    then runs the same generate calls and gets the same tokens.
    cuda_graphs: replay greedy steps from captured CUDA graphs (None = on when the device is CUDA).
    """
    dev = torch.device(device) if device is not None else default_device()
    dt = _dtype(dtype, dev)
    model_dir = resolve_model_dir(model)
    base, medusa_sd = load_base(model_dir, dev, dt, tp)
    base.backend = backend
    medusa, source = None, None
    if heads is not False:
        if heads is not None and heads is not True:
            medusa = load_heads(heads, base.args, dev, dt, tp=tp)
            source = str(heads) if not isinstance(heads, dict) else "<state dict>"
        elif medusa_sd:
            medusa = load_heads(medusa_sd, base.args, dev, dt, where=f"{model_dir} (medusa_head.*)", tp=tp)
            source = f"{model_dir} (medusa_head.*)"
        elif (found := find_heads(model_dir)) is not None:
            medusa = load_heads(found, base.args, dev, dt, tp=tp)
            source = str(found)
        elif heads is True:
            raise ModelLoadError(f"{model_dir}: no Medusa heads found")
    return Engine(base, medusa, load_tokenizer(model_dir), str(model), source, max_seq_len, cuda_graphs)
