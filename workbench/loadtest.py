"""`python -m workbench.loadtest`: concurrency, cancellation, memory and faults against a live app.

Loopback only, bounded loops that stop by themselves. Starts `app.py` as its own process on a free
127.0.0.1 port with the demo model on CPU (so the memory curve is the server's alone), then: N
concurrent gradio_client sessions (greedy outputs must equal a single-session run), a stream
cancelled mid-run followed by a new run, injected faults (bad requests between good ones; a KV
cache too large for memory, through the engine API), what the file and upload routes serve, and M
sequential requests with the server's resident memory sampled along the way. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
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


def start_server(data_dir: Path, timeout_s: float = 180) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free loopback port; returns once it answers."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(data_dir / "server.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "app.py"), "--device", "cpu",
                                 "--port", str(port), "--data-dir", str(data_dir)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited ({proc.returncode}): {(data_dir / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the app did not answer within {timeout_s} s")


def file_access(data_dir: Path, url: str) -> dict:
    """What the file and upload routes give: a saved tree yes; anything else, and big uploads, no."""
    import httpx

    import trees

    secret = data_dir / "secret.txt"
    secret.write_text("not for the browser")
    saved = trees.save_tree(trees.TreeFile([[0], [1]], name="loadtest"), data_dir / "trees" / "loadtest.json",
                            overwrite=True)
    get = {
        "saved tree": str(saved),
        "/etc/passwd": "/etc/passwd",
        "data folder file outside trees/": str(secret),
        "traversal out of trees/": f"{data_dir}/trees/../secret.txt",
        "the app's own source": str(Path(__file__).resolve()),
    }
    out = {name: httpx.get(f"{url}gradio_api/file={path}").status_code for name, path in get.items()}
    for name, size in (("upload 10 KB", 10_000), ("upload 2 MB", 2_000_000)):
        r = httpx.post(f"{url}gradio_api/upload", files={"files": ("t.json", b"[" + b" " * size + b"]")})
        out[name] = r.status_code
    return out


def run(sessions: int = 20, sequential: int = 200, tokens: int = 24, sample_every: int = 10) -> dict:
    from gradio_client import Client

    import engine
    import trees
    from engine.prompts import heldout_prompts

    data_dir = Path(tempfile.mkdtemp(prefix="loadtest-"))
    server, url = start_server(data_dir)
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
        eng = engine.load("demo", device="cpu")  # the same engine code, in this process
        try:  # a cache far larger than memory: refused before allocation, engine keeps serving
            eng.generate([prompts[0]] * 200_000, 4, mode="ar")
            oom = "no error"
        except engine.GenerationError as e:
            oom = str(e)
        after_oom = eng.generate(prompts[0], tokens, mode="medusa", tree=tree).token_ids
        faults.append({"case": "KV cache for 200000 requests (engine API)", "answer": oom,
                       "as_expected": "out of memory" in oom, "next_good_run_unchanged": after_oom == single[0]})
        out["faults"] = faults
        out["file_access"] = file_access(data_dir, url)

        curve, mismatches = [], 0
        t0 = time.perf_counter()
        for i in range(sequential):
            j = i % sessions
            got = ref.predict(prompts[j], tree, "medusa", "greedy", tokens, api_name="/generate")["token_ids"]
            mismatches += got != single[j]
            if i % sample_every == 0 or i == sequential - 1:
                curve.append([i + 1, round(rss_mib(server.pid), 1)])
        half = [m for n, m in curve if n > sequential // 2]
        out["sequential"] = {"requests": sequential, "mismatches": mismatches, "wall_s": round(time.perf_counter() - t0, 2),
                             "rss_mib_curve": curve,
                             "rss_growth_second_half_mib": round(max(half) - min(half), 1) if half else None}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
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
