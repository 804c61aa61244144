"""Why a tree step costs more than the AR step on a CPU: F.linear's median time at 1, 3, 13 and 65
rows for SmolLM2-135M's matrices (qkv, gate/up, down, lm_head), against the same product with
oneDNN's linear. Prints JSON. Usage: python benchmarks/cpu_gemm_rows.py [--threads 2]"""

import argparse
import json
import statistics
import time

import torch

SHAPES = {"qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def median_us(fn, reps: int = 60) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    torch.set_num_threads(ap.parse_args().threads)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k)
        w_onednn = w.to_mkldnn()
        for m in (1, 3, 13, 65):
            x = torch.randn(m, k)
            rows.append({"matrix": name, "N": n, "K": k, "rows": m,
                         "linear_us": round(median_us(lambda: torch.nn.functional.linear(x, w))),
                         "onednn_us": round(median_us(lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), w_onednn,
                                                                                         None).to_dense()))})
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
