"""`python -m workbench.loadtest`: concurrency, cancellation, memory and faults against a live app.

Loopback only, bounded loops that stop by themselves. Starts the app on a free 127.0.0.1 port with
the demo model on CPU, then: N concurrent gradio_client sessions (greedy outputs must equal a
single-session run), a stream cancelled mid-run followed by a new run, M sequential requests with
the process's resident memory sampled along the way, and injected faults (bad requests between
good ones, a KV cache too large for memory). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


BAD_REQUESTS = [  # (prompt, tree, max_new_tokens, what the error must mention)
    ("", "demo_tuned", 8, "empty"),
    ("   \n\t ", "demo_tuned", 8, "empty"),
    ("x", "[[0, 1]]", 8, "prefix [0] is missing"),
    ("x", "[[0], [0, 0, 0, 0, 0]]", 8, "missing"),
    ("x", "not_a_tree", 8, "unknown tree"),
    ("x", "demo_tuned", 100_000, "exceeds the context"),
    ("x", "demo_tuned", -3, "positive integer"),
    ("\x00\x01\x1b[31m" * 50, "demo_tuned", 8, None),  # control characters: decodes (no error needed)
]


def run(sessions: int = 20, sequential: int = 200, tokens: int = 24, sample_every: int = 10) -> dict:
    from gradio_client import Client

    import engine
    import trees
    from engine.prompts import heldout_prompts

    from .app import build_app
    from .handlers import Workbench

    wb = Workbench(engine.load("demo", device="cpu"), Path(tempfile.mkdtemp(prefix="loadtest-")))
    app = build_app(wb)
    app.queue(default_concurrency_limit=1, max_size=4 * sessions + 16)
    _, url, _ = app.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    tree = trees.DEFAULT_TREE
    out: dict = {"url_host": "127.0.0.1", "sessions": sessions, "tokens": tokens}
    try:
        prompts = [heldout_prompts(sessions)[i % sessions] for i in range(sessions)]
        ref = Client(url, verbose=False)
        single = [ref.predict(p, tree, "medusa", "greedy", tokens, api_name="/generate")["token_ids"] for p in prompts]

        def session(i: int) -> list[int]:
            return Client(url, verbose=False).predict(prompts[i], tree, "medusa", "greedy", tokens,
                                                      api_name="/generate")["token_ids"]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(sessions) as pool:
            together = list(pool.map(session, range(sessions)))
        out["concurrent"] = {"completed": sum(1 for t in together if t), "identical_to_single": sum(
            a == b for a, b in zip(together, single)), "wall_s": round(time.perf_counter() - t0, 2)}

        # cancel a long stream once it has produced something, then run again
        job = ref.submit(prompts[0], tree, "", "medusa", "greedy", 0.7, 400, api_name="/generate_stream")
        deadline = time.time() + 60
        while not job.outputs() and time.time() < deadline:
            time.sleep(0.05)
        streamed_before_cancel = len(job.outputs())
        job.cancel()
        t_cancel = time.perf_counter()
        after = ref.predict(prompts[0], tree, "medusa", "greedy", tokens, api_name="/generate")["token_ids"]
        out["cancel"] = {"outputs_before_cancel": streamed_before_cancel, "next_run_ok": after == single[0],
                         "next_run_done_s_after_cancel": round(time.perf_counter() - t_cancel, 2)}

        # faults: every bad request answers with its message, and the next good one is unchanged
        faults = []
        for prompt, bad_tree, n, expect in BAD_REQUESTS:
            got = ref.predict(prompt, bad_tree, "medusa", "greedy", n, api_name="/generate")
            good = ref.predict(prompts[0], tree, "medusa", "greedy", tokens, api_name="/generate")["token_ids"]
            ok = (expect is None and "token_ids" in got) or (expect is not None and expect in got.get("error", ""))
            faults.append({"case": repr(prompt[:12]) + f" {bad_tree} {n}", "answer": got.get("error", "decoded"),
                           "as_expected": ok, "next_good_run_unchanged": good == single[0]})
        try:  # a cache far larger than memory: refused before allocation, engine keeps serving
            wb.engine.generate([prompts[0]] * 200_000, 4, mode="ar")
            oom = "no error"
        except engine.GenerationError as e:
            oom = str(e)
        faults.append({"case": "KV cache for 200000 requests", "answer": oom, "as_expected": "out of memory" in oom,
                       "next_good_run_unchanged": session(0) == single[0]})
        out["faults"] = faults

        curve, mismatches = [], 0
        t0 = time.perf_counter()
        for i in range(sequential):
            j = i % sessions
            got = ref.predict(prompts[j], tree, "medusa", "greedy", tokens, api_name="/generate")["token_ids"]
            mismatches += got != single[j]
            if i % sample_every == 0 or i == sequential - 1:
                curve.append([i + 1, round(rss_mib(), 1)])
        half = [m for n, m in curve if n > sequential // 2]
        out["sequential"] = {"requests": sequential, "mismatches": mismatches, "wall_s": round(time.perf_counter() - t0, 2),
                             "rss_mib_curve": curve,
                             "rss_growth_second_half_mib": round(max(half) - min(half), 1) if half else None}
    finally:
        app.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--sequential", type=int, default=200)
    p.add_argument("--tokens", type=int, default=24)
    a = p.parse_args(argv)
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), **run(a.sessions, a.sequential, a.tokens)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
