"""Host time of a trace line and of the detokeniser on the CPU, on real demo events:
`PYTHONPATH=. python3 benchmarks/trace_host_cpu.py` (run it from another checkout's copy of engine/ and trees/ to
compare versions). Prints one JSON line: `StepEvent.to_json` per AR and per Medusa (`mc_sim_7b_63`) step of a
300-token traced run; per AR step, its heads' top-k from the row a heads pass hands the host (ids, then millionths)
put into the event and then the trace line built (`fill_and_to_json_ar_us`: through `decode.head_topk_lists`'s
tuples in engines before 2026-12-07's twenty-fourth session, `StepEvent.head_fields` since);
`IncrementalDetokenizer.push` per token, and one decode of ten ids through transformers' `decode` and through its
Rust backend; best of five, µs."""

from __future__ import annotations

import json
import time

import engine
from engine import decode
from engine.detok import IncrementalDetokenizer
from engine.trace import StepEvent


def best_us(fn, per: int, tries: int = 5) -> float:
    best = min(_timed(fn) for _ in range(tries))
    return round(best / per * 1e6, 2)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    eng = engine.load("demo")
    prompt = "def read_config(path):"
    ar = list(eng.stream(prompt, mode="ar", max_new_tokens=300, stop_on_eos=False, trace=True))
    medusa = list(eng.stream(prompt, mode="medusa", tree="mc_sim_7b_63", max_new_tokens=300, stop_on_eos=False, trace=True))
    ids = [t for ev in ar for t in ev.tokens]
    tok = eng.tokenizer
    topk = len(ar[0].head_topk[0])
    rows = [[t for h in ev.head_topk for t, _ in h] + [round(p * 1e6) for h in ev.head_topk for _, p in h] for ev in ar]

    def fill_and_to_json():
        for ev, row in zip(ar, rows):
            if "head_fields" in StepEvent.__dataclass_fields__:
                ev.head_fields, ev.topk = row, topk
            else:
                ev.head_topk = decode.head_topk_lists(row, len(row) // 2, topk)
            ev.to_json()

    def detok():
        d = IncrementalDetokenizer(tok)
        for t in ids:
            d.push([t])

    ten = ids[:10]
    print(json.dumps({
        "to_json_ar_us": best_us(lambda: [ev.to_json() for ev in ar], len(ar)),
        "to_json_medusa_us": best_us(lambda: [ev.to_json() for ev in medusa], len(medusa)),
        "fill_and_to_json_ar_us": best_us(fill_and_to_json, len(ar)),
        "detok_push_us": best_us(detok, len(ids)),
        "decode_10_ids_transformers_us": best_us(lambda: [tok.decode(ten, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                                                          for _ in range(2000)], 2000),
        "decode_10_ids_backend_us": best_us(lambda: [tok.backend_tokenizer.decode(ten, skip_special_tokens=True)
                                                     for _ in range(2000)], 2000),
    }))


if __name__ == "__main__":
    main()
