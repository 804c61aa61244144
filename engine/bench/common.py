"""What every benchmark part shares: the environment record, timing, round-robin runs, intervals."""

from __future__ import annotations

import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from ..heap import CollectorPauses

PROGRESS_S = 30.0  # seconds between round_robin's progress lines

# two-sided 95 % Student t quantiles by degrees of freedom (1..30); beyond, the normal's 1.96
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_ci(values: Sequence[float]) -> dict:
    """Mean and 95 % t-interval of independent repeats (rounds), with min and max."""
    n = len(values)
    m = statistics.fmean(values)
    half = _T95[min(n - 1, 29)] * statistics.stdev(values) / math.sqrt(n) if n > 1 else float("nan")
    return {"mean": round(m, 4), "ci95": [round(m - half, 4), round(m + half, 4)] if n > 1 else None,
            "min": round(min(values), 4), "max": round(max(values), 4), "n": n}


def env(eng) -> dict:
    import torch

    dev = eng.device
    return {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
            "torch": torch.__version__, "dtype": str(eng.model.embed_tokens.weight.dtype).replace("torch.", ""),
            "backend": eng.model.backend, "cuda_graphs": eng.graphs is not None, "gemm": eng.model.gemm}


def engine_runner(eng, cfg) -> Callable[[object], tuple[list[int], int]]:
    """A `round_robin` runner: eng.generate under `cfg` -> (output token ids, steps)."""
    def run(prompt):
        r = eng.generate(prompt, config=cfg)
        return r.token_ids, r.steps
    return run


def device_sync(eng) -> Callable[[], None]:
    """What `round_robin` calls around each timed run: a CUDA sync on the GPU, nothing on the CPU."""
    if eng.device.type == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def warm_up(runners: dict[str, Callable[[object], object]], prompts: Sequence) -> None:
    """Run every runner on the longest prompt, then the shortest, before anything is timed: the KV
    cache reaches the capacity the timed prompts need (a larger cache is a new allocation, and every
    CUDA graph is captured again), graphs are captured and kernels tuned, and compiled code has seen
    two prefill lengths (so it has gone dynamic)."""
    by_length = sorted(prompts, key=len)
    for p in (by_length[-1], by_length[0]):
        for run in runners.values():
            run(p)


def round_robin(runners: dict[str, Callable[[object], tuple[list[int], int]]], prompts: Sequence, rounds: int,
                sync: Callable[[], None] = lambda: None) -> dict[str, dict]:
    """Time each runner on every prompt, interleaved (round -> prompt -> runner), so a noisy
    neighbour slows every runner alike instead of whichever ran during it. A runner maps a prompt to
    (output token ids, steps). -> per runner: totals, tokens/s per round, the round-0 outputs, and
    Python's collections inside its timed runs (`gc`: in a process whose heap is not frozen a full one
    stalls the host for a fifth of a second, engine/heap.py). A long run (a CPU table takes most of an
    hour) says on stderr where it is, every PROGRESS_S."""
    out = {name: {"tokens": 0, "steps": 0, "wall_s": 0.0, "round_tokens_per_s": [], "outputs": []} for name in runners}
    pauses = {name: CollectorPauses() for name in runners}
    try:
        _run_rounds(runners, prompts, rounds, sync, out, pauses)
    finally:
        for p in pauses.values():
            p.close()
    for name, o in out.items():
        o["tokens_per_s"] = round(o["tokens"] / o["wall_s"], 2)
        o["tokens_per_step"] = round(o["tokens"] / max(o["steps"], 1), 4)
        o["wall_s"] = round(o["wall_s"], 3)
        o["gc"] = pauses[name].summary()
    return out


def _run_rounds(runners: dict[str, Callable[[object], tuple[list[int], int]]], prompts: Sequence, rounds: int,
                sync: Callable[[], None], out: dict[str, dict], pauses: dict[str, CollectorPauses]) -> None:
    said = time.perf_counter()
    for r in range(rounds):
        tok = dict.fromkeys(runners, 0)
        wall = dict.fromkeys(runners, 0.0)
        for i, p in enumerate(prompts):
            if time.perf_counter() - said > PROGRESS_S:
                said = time.perf_counter()
                print(f"bench: round {r + 1}/{rounds}, prompt {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
            for name, run in runners.items():
                sync()
                with pauses[name]:
                    t0 = time.perf_counter()
                    ids, steps = run(p)
                    sync()
                    wall[name] += time.perf_counter() - t0
                tok[name] += len(ids)
                o = out[name]
                o["tokens"] += len(ids)
                o["steps"] += steps
                if r == 0:
                    o["outputs"].append(ids)
        for name in runners:
            out[name]["wall_s"] += wall[name]
            out[name]["round_tokens_per_s"].append(tok[name] / wall[name])


def ratio(a: dict, b: dict) -> dict:
    """Per-round tokens/s of a over b: mean and interval over rounds."""
    return mean_ci([x / y for x, y in zip(a["round_tokens_per_s"], b["round_tokens_per_s"])])


def cuda_ms(fn, iters: int = 30) -> float:
    """Median wall time of fn() in ms, synchronised."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    import torch
    import triton

    x = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=200, return_mode="median")
    return 2 * x.numel() / (ms * 1e-3)


def fit_prompts(eng, prompts: Sequence[str], max_new: int, chat: bool = False) -> tuple[list[list[int]], int]:
    """Prompts as token ids (in the chat template when `chat`), each cut to its last (context - max_new)
    tokens so a long run fits. -> (ids, how many were cut)."""
    room = eng.max_seq_len - max_new
    if room < 1:
        raise ValueError(f"--max-new-tokens {max_new} leaves no room for a prompt in the context of {eng.max_seq_len}")
    ids = [eng.encode(p, chat=chat) for p in prompts]
    return [i[-room:] for i in ids], sum(len(i) > room for i in ids)
