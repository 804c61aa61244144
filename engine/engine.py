"""`engine.load(...) -> Engine`: one model, its heads and tokenizer, and the generate/stream API."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

import trees

from .config import ModelLoadError
from .decode import prefill
from .detok import TokenTexts, decode
from .generation import GenerationConfig, GenerationError
from .graphs import StepGraphs
from .head_trace import HEAD_TRACE_STEPS, HeadTrace, PassGraphs
from .heads import MedusaHeads
from .loading import (
    TREE_FILE,
    check_backend,
    check_heads_folder,
    default_backend,
    find_heads,
    generation_eos,
    heads_dir,
    load_base,
    load_heads,
    load_tokenizer,
    read_heads_folder,
    resolve_model_dir,
)
from .model import Transformer
from .sampling import SamplingParams
from .session import EagerRunner, GraphRunner, Request, Session
from .tp import SINGLE, TP
from .trace import StepEvent, TraceContext, TraceWriter, header, prompt_hash

CACHE_GRANULE = 256  # KV cache capacity is rounded up to this, so similar requests reuse one cache (and its graphs)
TREES_KEPT = 32  # trees whose verification buffers an engine keeps on its device, the most recently used


class EngineBusy(RuntimeError):
    """This thread holds the engine in an open `stream()` and asked it for another run."""


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


def parse_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {device!r}; use cpu or cuda[:N]") from None
    if dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"device {device!r} is not supported; use cpu or cuda[:N]")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r}: this torch build or machine has no CUDA")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
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
    """A loaded model with its heads and tokenizer. Build it with `engine.load`; the model is used as
    built (backend and fused kernels fixed by `loading.build_model`). `model_dir` is the folder the
    base model was read from (other tools, transformers among them, can open the same files);
    `default_tree` is the tree used when a call names none (see `load`).

    Sharing: an Engine decodes one run at a time, because the run's state (the KV cache, the CUDA
    graphs' buffers) lives in the one model. `generate()` and `greedy_continuations()` hold the engine
    for the call; `stream()` from the call until its iterator is exhausted, closed or garbage
    collected. A run asked for from another thread meanwhile waits its turn (a queue), so threads
    sharing an engine each get exactly their solo output. A run asked for from the thread that holds
    an open stream raises EngineBusy at once, since waiting there would never end: finish or `close()`
    that stream first.
    """

    def __init__(self, model: Transformer, heads: MedusaHeads | None, tokenizer, name: str, heads_source: str | None,
                 max_seq_len: int | None = None, cuda_graphs: bool = False, model_dir: Path | None = None,
                 default_tree: object = None, extra_eos: tuple[int, ...] = ()):
        self.model, self.heads, self.tokenizer = model, heads, tokenizer
        self.model_dir = model_dir
        if cuda_graphs and self.device.type != "cuda":
            raise ModelLoadError("cuda_graphs needs a CUDA device")
        # greedy steps replay captured CUDA graphs (engine/graphs.py)
        self.graphs = StepGraphs(model) if cuda_graphs else None
        self.head_passes = PassGraphs() if cuda_graphs else None  # a traced AR run's heads passes and their ring
        self.name, self.heads_source = name, heads_source
        self.args = model.args
        context = self.args.max_position_embeddings
        if self.args.sliding_window:
            context = min(context, self.args.sliding_window)  # beyond the window our attention would differ
        if max_seq_len is not None and (isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1):
            raise ModelLoadError(f"max_seq_len must be a positive integer, got {max_seq_len!r}")
        self.max_seq_len = min(max_seq_len or context, context)
        self.topk = min(10, self.args.vocab_size)  # candidates per head (a tiny vocabulary has fewer)
        eos = set(self.args.eos_token_ids) | set(extra_eos)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = eos
        self.default_tree = default_tree if default_tree is not None else self._fallback_tree()
        self._token_text = TokenTexts(tokenizer)  # each token's text, for trace lines
        self._tree_buffers: collections.OrderedDict[tuple, trees.TreeBuffers] = collections.OrderedDict()
        self._turn = threading.Lock()  # held by the run in progress (see the class docstring)
        self._holder: int | None = None  # the thread that took it

    def _acquire(self) -> None:
        me = threading.get_ident()
        if self._holder == me:
            raise EngineBusy("this thread has an open stream() on this engine: exhaust or close() it before "
                             "starting another run (an Engine decodes one run at a time)")
        self._turn.acquire()
        self._holder = me

    def _release(self) -> None:
        self._holder = None
        self._turn.release()

    def _fallback_tree(self) -> object:
        """For heads that ship no tree: Medusa's own default, `mc_sim_7b_63`, cut to the heads' depth."""
        return [p for p in trees.preset("mc_sim_7b_63") if len(p) <= max(self.num_heads, 1)]

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads if self.heads is not None else 0

    # -- text ----------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        if not isinstance(prompt, (str, list, tuple)):
            raise GenerationError(f"a prompt is text (str) or a list of token ids, not {type(prompt).__name__}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise GenerationError("this model has no tokenizer: pass token ids")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError:
                raise GenerationError("the prompt is not valid Unicode text (it holds a lone surrogate)") from None
            if chat and getattr(self.tokenizer, "chat_template", None):
                try:
                    ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                             add_generation_prompt=True, tokenize=True)
                except Exception as e:  # the template is the model folder's own Jinja code: it may not parse or may raise
                    raise GenerationError(f"--chat: the tokenizer's chat template failed ({type(e).__name__}: "
                                          f"{' '.join(str(e).split())[:200]})") from None
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            elif chat:
                raise GenerationError("--chat: this tokenizer has no chat template")
            else:
                ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        if not ids:
            raise GenerationError("the prompt is empty (no tokens)")
        bad = [t for t in ids if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.args.vocab_size)]
        if bad:
            raise GenerationError(f"token id {bad[0]!r} is outside the vocabulary [0, {self.args.vocab_size})")
        return [int(t) for t in ids]

    def text_of(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return decode(self.tokenizer, ids)

    # -- settings ------------------------------------------------------------------------------
    def resolve_tree(self, tree) -> list[list[int]]:
        """A tree spec (preset name, file, JSON, paths; None = this engine's default tree) -> paths."""
        if self.heads is None:
            raise GenerationError("mode 'medusa' needs Medusa heads; this engine was loaded without any")
        try:
            return trees.resolve(self.default_tree if tree is None else tree, topk=self.topk, num_heads=self.num_heads)
        except trees.TreeError as e:
            raise GenerationError(f"bad tree: {e}") from None

    def tree_buffers(self, choices: list[list[int]]) -> trees.TreeBuffers:
        """A tree's verification buffers on this engine's device, built at its first run and kept (the
        TREES_KEPT most recently used). Built at every run (with the shipped tree's file read each time),
        a 63-node tree's `session()` took 5.9 ms on a 2-core CPU against 0.3 ms kept; on an H100's host a
        demo 256-token Medusa run (60 steps) took 0.33-0.34 ms a step with the rebuild against 0.24-0.25
        kept (benchmarks/README.md, twenty-fifth session).
        Runs hold the engine (class docstring), so one thread at a time uses the dict; nothing writes
        into the buffers."""
        key = tuple(map(tuple, choices))
        buf = self._tree_buffers.pop(key, None)
        if buf is None:
            buf = trees.buffers(choices, topk=self.topk).to(self.device)
        self._tree_buffers[key] = buf  # the most recently used last
        if len(self._tree_buffers) > TREES_KEPT:
            self._tree_buffers.popitem(last=False)
        return buf

    def config(self, max_new_tokens: int | None = None, config: GenerationConfig | None = None,
               **fields) -> GenerationConfig:
        """The validated config of a call: `config` (or the defaults), then the keyword overrides."""
        cfg = config or GenerationConfig()
        if max_new_tokens is not None:
            fields["max_new_tokens"] = max_new_tokens
        return self.resolved((cfg.replace(**fields) if fields else cfg).validate())

    @property
    def default_mode(self) -> str:
        """The mode a call that names none decodes in: Medusa with heads, else AR."""
        return "medusa" if self.heads is not None else "ar"

    def resolved(self, cfg: GenerationConfig) -> GenerationConfig:
        """The config with this engine's defaults filled in: mode None decodes with the heads when
        there are any (else AR), chat None uses the chat template when the tokenizer has one (instruct
        models: their answers follow the template's turns)."""
        changes = {}
        if cfg.mode is None:
            changes["mode"] = self.default_mode
        if cfg.chat is None:
            changes["chat"] = self.has_chat_template
        return cfg.replace(**changes) if changes else cfg

    def check_cache_fits(self, batch: int, capacity: int) -> None:
        """Refuse a KV cache that cannot fit before allocating it: a CPU allocation that overcommits
        is killed by the OS later, not refused, so asking the allocator is not enough."""
        a = self.args
        elt = self.model.embed_tokens.weight.element_size()
        need = 2 * a.n_layers * batch * (a.n_kv_heads // self.model.tp.world) * capacity * a.head_dim * elt
        held = self.model.cache.k.numel() * 2 * elt if self.model.cache is not None else 0
        free = self.free_memory() + held
        if need > 0.9 * free:
            raise GenerationError(f"out of memory: a KV cache for {batch} x {capacity} tokens needs {need / 2**30:.2f} GiB; "
                                  f"{free / 2**30:.2f} GiB is free")

    def free_memory(self) -> int:
        """Bytes free on this engine's device (`device_free_memory`)."""
        return device_free_memory(self.device)

    def held_memory(self) -> int:
        """Bytes this engine's tensors hold: weights, heads and KV cache (a module of the model, so
        among its buffers), each storage once: what letting the engine go frees."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        if self.heads is not None:
            tensors += [*self.heads.parameters(), *self.heads.buffers()]
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

    def cache_capacity(self, need: int, nodes: int) -> int:
        """KV slots for a run that needs `need`: rounded up to CACHE_GRANULE (similar runs share a cache
        and its graphs), at most the context plus a tree of `nodes`."""
        return min(-(-need // CACHE_GRANULE) * CACHE_GRANULE, self.max_seq_len + nodes)

    # -- decoding ------------------------------------------------------------------------------
    def session(self, prompts: list, cfg: GenerationConfig) -> Session:
        """Check everything (settings, tree, prompt lengths, memory), size the cache, and set up a run."""
        cfg = self.resolved(cfg.validate())
        choices = self.resolve_tree(cfg.tree) if cfg.mode == "medusa" else None
        buf = self.tree_buffers(choices) if choices else None
        nodes = buf.num_nodes if buf is not None else 1
        if self.model.cache is None or self.model.cache.batch < len(prompts):
            # a batch that cannot fit even at one token a prompt is refused before all of it is tokenised
            self.check_cache_fits(len(prompts), self.cache_capacity(1 + cfg.max_new_tokens + nodes, nodes))
        batch = [self.encode(p, chat=cfg.chat) for p in prompts]
        for r, ids in enumerate(batch):
            if len(ids) + cfg.max_new_tokens > self.max_seq_len:
                which = f"prompt {r}" if len(batch) > 1 else "prompt"
                raise GenerationError(f"{which} of {len(ids)} tokens + max_new_tokens {cfg.max_new_tokens} = "
                                      f"{len(ids) + cfg.max_new_tokens} exceeds the context of {self.max_seq_len} tokens")
        capacity = self.cache_capacity(max(map(len, batch)) + cfg.max_new_tokens + nodes, nodes)
        cache = self.model.cache
        if cache is None or cache.capacity < capacity or cache.batch < len(batch):
            self.check_cache_fits(len(batch), capacity)
            try:
                self.model.setup_cache(len(batch), capacity)
            except torch.OutOfMemoryError:
                self.model.cache = None
                raise GenerationError(f"out of memory allocating a KV cache of {len(batch)} x {capacity} tokens") from None
        params, rule = cfg.sampling(), cfg.rule()
        gen = None
        if rule.samples:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.model.tp.shared_seed(cfg.seed if cfg.seed is not None else int(time.time_ns() % 2**31)))
        heads = self.heads if cfg.mode == "medusa" else None
        trace_topk = self.topk if cfg.traced else 0
        graphed = self.graphs is not None and StepGraphs.usable(self.model, rule, cfg.mode)
        if graphed:
            runner = GraphRunner(self.graphs, heads, buf, choices, trace_topk)
        else:
            runner = EagerRunner(self.model, heads, buf, rule, params, gen, trace_topk)
        # an AR trace with the heads' top-k (it feeds the head statistics) runs them outside the steps
        head_trace = None
        if cfg.mode == "ar" and cfg.traced and cfg.trace_heads and self.heads is not None:
            head_trace = HeadTrace(self.heads, self.model.lm_head.weight, self.topk,
                                   HEAD_TRACE_STEPS if graphed else 1, len(batch), self.head_passes if graphed else None,
                                   ahead=runner.ahead)  # its ring also holds the steps the runner queues
            if graphed:  # a traced AR run's captured steps write their hidden states into the heads' ring
                runner.ring = head_trace.graph_ring
        trace = writer = None
        if cfg.traced:
            if cfg.trace_file:
                try:  # a FIFO would block the writer's open; a device is never written to
                    trees.check_output_file(cfg.trace_file)
                except trees.OutputPathError as e:
                    raise GenerationError(str(e)) from None
            writer = TraceWriter(cfg.trace_file) if cfg.trace_file else None
            if writer:
                one = len(batch) == 1  # a batched header lists one value per request
                extra = {"temperature": params.temperature,
                         "prompt_tokens": len(batch[0]) if one else [len(i) for i in batch],
                         "prompt_ids": list(batch[0]) if one else [list(i) for i in batch],
                         "prompt_sha256": prompt_hash(batch[0]) if one else [prompt_hash(i) for i in batch],
                         "max_new_tokens": cfg.max_new_tokens, "stop_on_eos": cfg.stop_on_eos, "seed": cfg.seed,
                         "dtype": str(self.model.embed_tokens.weight.dtype).removeprefix("torch."),
                         "device": str(self.device), "backend": self.model.backend}
                if cfg.mode == "ar":  # whether the steps hold the heads' top-k (tree statistics need it)
                    extra["trace_heads"] = cfg.trace_heads
                writer.write(header(self.name, self.heads_source, choices, cfg.mode, cfg.accept, extra))
            parent = buf.parent.tolist() if buf is not None else [-1]
            trace = TraceContext(choices or [], parent, self._token_text.__getitem__, batched=len(batch) > 1)
        requests = [Request(i, ids, self.tokenizer, cfg.max_new_tokens, self.eos_ids, cfg.stop_on_eos, cfg.text)
                    for i, ids in enumerate(batch)]
        return Session(self.model, heads, requests, cfg, buf, choices, runner, trace, writer, gen, head_trace)

    def stream(self, prompt_or_ids: str | Sequence[int], max_new_tokens: int | None = None,
               config: GenerationConfig | None = None, **fields) -> Iterator[StepEvent]:
        """One StepEvent per decoding step (the UI draws each as it arrives). Settings are a
        GenerationConfig and/or its fields as keywords; they are checked here, before the first step.
        The iterator holds the engine until it is exhausted, closed or dropped (class docstring)."""
        cfg = self.config(max_new_tokens, config, **fields)
        self._acquire()
        try:
            session = self.session([prompt_or_ids], cfg)
        except BaseException:
            self._release()
            raise
        return _Stream(session, self._release)

    def generate(self, prompt_or_ids, max_new_tokens: int | None = None, config: GenerationConfig | None = None,
                 **fields) -> Result | list[Result]:
        """One prompt (text or token ids) -> Result; a list of prompts (texts or id lists) -> one
        Result per prompt, decoded together as a batch. Waits for a run of another thread to end."""
        cfg = self.config(max_new_tokens, config, **fields)
        batched = isinstance(prompt_or_ids, (list, tuple)) and bool(prompt_or_ids) and \
            all(isinstance(p, (str, list, tuple)) for p in prompt_or_ids)
        prompts = list(prompt_or_ids) if batched else [prompt_or_ids]
        self._acquire()
        try:
            t0 = time.perf_counter()
            session = self.session(prompts, cfg)
            per_request: list[list[StepEvent]] = [[] for _ in prompts]
            traces: list[list[dict]] = [[] for _ in prompts]
            try:
                for events in session.run():
                    for ev in events:
                        per_request[ev.request].append(ev)
                        if ev.trace is not None:  # built here, while the GPU runs the step queued after this one
                            traces[ev.request].append(ev.trace)
            finally:
                session.close()
            wall = time.perf_counter() - t0
        finally:
            self._release()
        results = []
        for req, evs, req_traces in zip(session.requests, per_request, traces):
            results.append(Result(
                text="".join(e.text for e in evs),
                token_ids=req.tokens,
                new_tokens=len(req.tokens),
                steps=len(evs),
                mean_accepted=len(req.tokens) / max(len(evs), 1),
                wall_s=wall,
                tokens_per_s=len(req.tokens) / wall if wall > 0 else 0.0,
                mode=cfg.mode,
                tree=session.choices,
                prompt_tokens=len(req.prompt),
                finish_reason=req.finish or "length",
                traces=req_traces,
            ))
        return results if batched else results[0]

    @torch.inference_mode()
    def greedy_continuations(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Exactly max_new_tokens greedy AR tokens after each prompt of a batch (token ids), with no EOS
        stop, no text and no per-step events: the tokens stay on the device until one read at the end.
        This is the bulk path (self-distillation decodes hundreds of requests a step): `generate` does
        host work per request per step, 6.8 ms a step at 256 requests on an H200 (2026-12-04), several
        times the GPU's step. Equal to `generate(..., mode="ar", stop_on_eos=False)` (tested)."""
        cfg = GenerationConfig(mode="ar", max_new_tokens=max_new_tokens, stop_on_eos=False, chat=False, text=False)
        self._acquire()  # the cache and the graphs' buffers are the engine's: one run at a time (class docstring)
        try:
            runner = self.session(prompts, cfg).runner  # the checks, the cache and the step runner of a run
            state = prefill(self.model, None, prompts, SamplingParams(), None)
            out = torch.empty((len(prompts), max_new_tokens), dtype=torch.long, device=self.device)
            out[:, 0] = state.root
            for i in range(1, max_new_tokens):
                runner.launch(state)  # queued, never read: a graph replays (or the eager step runs) on the device
                state.host_lengths = [n + 1 for n in state.host_lengths]  # what reading the step would have done
                out[:, i] = state.root
            return out.tolist()
        finally:
            self._release()


class _Stream:
    """What `Engine.stream` returns: the run's StepEvents, holding the engine until the run is
    exhausted, closed or garbage collected (a generator that was never started runs no `finally`,
    so a plain generator could not promise that)."""

    def __init__(self, session: Session, release):
        self._session, self._release = session, release
        self._steps = (events[0] for events in session.run())  # refers to the session only: no cycle through self

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> StepEvent:
        if self._release is None:
            raise StopIteration
        try:
            return next(self._steps)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the run after the step in flight and give the engine back (idempotent)."""
        release, self._release = self._release, None
        if release is None:
            return
        try:
            self._steps.close()
            self._session.close()
        finally:
            release()

    def __del__(self) -> None:
        self.close()


def device_free_memory(device: torch.device) -> int:
    """Bytes free on a device: CUDA's count plus what torch's allocator holds unused (it reuses that
    first), or what the OS can still give this process. A function of the device, not of an engine, so
    that whoever asks (the app's engine cache) keeps no engine alive."""
    if device.type == "cuda":
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + unused
    return available_memory()


def available_memory() -> int:
    """Bytes of memory the OS can still give this process: Linux MemAvailable (else a page count),
    bounded by the process's cgroup v2 limit where one is set."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = cgroup_room()
    return free if room is None else min(free, room)


def cgroup_room() -> int | None:
    """This process's cgroup v2 memory limit less what it uses that the kernel cannot reclaim (its
    usage less inactive file pages), or None without a limit."""
    try:
        group = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].splitlines()[0].strip()
        folder = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        used = int((folder / "memory.current").read_text())
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    except (OSError, ValueError, IndexError):
        return None
    if limit == "max":
        return None
    return max(int(limit) - used + int(stat.get("inactive_file", 0)), 0)


def load(
    model: str | os.PathLike,
    heads: str | os.PathLike | dict | bool | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_seq_len: int | None = None,
    backend: str | None = None,
    tp: TP = SINGLE,
    cuda_graphs: bool | None = None,
    gemm: str = "cublas",
) -> Engine:
    """Load a local Llama-family model and its Medusa heads.

    model: a directory, `demo`, or `smollm2` (after `python -m engine fetch smollm2`), or an official
    Medusa heads folder (config.json with the Medusa fields + medusa_lm_head.pt), whose
    base_model_name_or_path must then be here (a folder, a named model or the local HF cache).
    heads=None finds them beside the model (medusa_heads.safetensors, medusa_lm_head.*, or
    `medusa_head.*` keys in a Medusa-2 checkpoint; for a named model, in the repo's folder for it);
    heads=False loads none; a path loads that file. A `medusa_choices.json` tree file beside the heads
    becomes the engine's default tree (else Medusa's mc_sim_7b_63 cut to the heads' depth).
    backend: attention backend (None: triton on CUDA, sdpa elsewhere). tp: this process's place in
    a tensor-parallel group (`engine.tp.init_from_env`); every rank then runs the same generate calls
    and gets the same tokens. cuda_graphs: replay greedy steps from captured CUDA graphs, with the
    fused Triton kernels (None = on when the device is CUDA). gemm: with graphs, which GEMM runs the
    projections and the lm_head: "cublas", "skinny" (engine/kernels/gemv.py) or "auto" (per weight shape and row bucket,
    whichever is faster on this GPU, timed once; engine/gemm_choice.py).
    """
    dev = parse_device(device)
    dt = parse_dtype(dtype, dev)
    backend = backend or default_backend(dev)
    check_backend(backend, dev, dt)
    graphs = dev.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
    if graphs and dev.type != "cuda":
        raise ModelLoadError("cuda_graphs needs a CUDA device")
    folder = read_heads_folder(model)  # an official heads folder: its base model, then its heads
    model_dir = folder.base_dir() if folder is not None else resolve_model_dir(model)
    if folder is not None and heads is None:
        heads = folder.path
    base, medusa_sd, _ = load_base(model_dir, dev, dt, tp, backend=backend, fused=graphs, gemm=gemm)
    medusa, source, tree_dir = None, None, None
    if heads is not False:
        if heads is not None and heads is not True:
            medusa = load_heads(heads, base.args, dev, dt, tp=tp)
            if (heads_folder := read_heads_folder(heads) if not isinstance(heads, dict) else None) is not None:
                check_heads_folder(heads_folder, medusa.num_heads, medusa.num_layers)
            source = str(heads) if not isinstance(heads, dict) else "<state dict>"
            tree_dir = None if isinstance(heads, dict) else Path(heads) if Path(heads).is_dir() else Path(heads).parent
        elif medusa_sd:
            medusa = load_heads(medusa_sd, base.args, dev, dt, where=f"{model_dir} (medusa_head.*)", tp=tp)
            source, tree_dir = f"{model_dir} (medusa_head.*)", model_dir
        elif (found := find_heads(heads_dir(model, model_dir))) is not None:
            medusa = load_heads(found, base.args, dev, dt, tp=tp)
            source, tree_dir = str(found), found.parent
        elif heads is True:
            raise ModelLoadError(f"{heads_dir(model, model_dir)}: no Medusa heads found")
    tree = str(tree_dir / TREE_FILE) if tree_dir is not None and (tree_dir / TREE_FILE).is_file() else None
    return Engine(base, medusa, load_tokenizer(model_dir), str(model), source, max_seq_len, graphs, model_dir=model_dir,
                  default_tree=tree, extra_eos=generation_eos(model_dir))
