"""`python -m trees validate|show|stats|optimize|export|diff`."""

from __future__ import annotations

import argparse
import json
import sys

from . import (
    TreeError,
    TreeFile,
    best_tree_empirical,
    best_tree_independent,
    bootstrap_interval,
    diff,
    expected_empirical,
    expected_independent,
    head_stats,
    load_tree,
    rank_vectors_from_file,
    resolve,
    save_tree,
    select_size,
    to_trtllm,
    to_vllm,
)


def draw(choices: list[list[int]]) -> str:
    """Text drawing: one line per node, indented by depth, labelled head/rank; depth-first (paths
    in lexicographic order) so every node sits under its parent."""
    lines = ["root"]
    for p in sorted(choices):
        lines.append("  " * len(p) + f"└ h{len(p) - 1} r{p[-1]}  {p}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trees")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    v.add_argument("file")
    v.add_argument("--topk", type=int, default=10)
    v.add_argument("--num-heads", type=int, default=None)
    s = sub.add_parser("show")
    s.add_argument("tree", help="preset name or JSON file")
    st = sub.add_parser("stats")
    st.add_argument("traces")
    st.add_argument("--tree", default=None, help="also estimate this tree's E")
    o = sub.add_parser("optimize")
    o.add_argument("--traces", required=True)
    o.add_argument("--nodes", type=int, default=64)
    o.add_argument("--estimator", choices=["empirical", "independent"], default="empirical")
    o.add_argument("--latency", default=None, help="JSON [[nodes, ms], ...]: choose the size by E(n)/t(n) up to --nodes")
    o.add_argument("--name", default="optimised")
    o.add_argument("--out", required=True)
    o.add_argument("--overwrite", action="store_true")
    e = sub.add_parser("export")
    e.add_argument("tree")
    e.add_argument("--to", choices=["trtllm", "vllm", "json"], required=True)
    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--traces", default=None)
    a = p.parse_args(argv)
    try:
        if a.cmd == "validate":
            tf = load_tree(a.file)
            from .tree import validate as _v

            _v(tf.medusa_choices, topk=a.topk, num_heads=a.num_heads)
            print(f"{a.file}: ok, {len(tf.medusa_choices)} nodes, depth {max(len(x) for x in tf.medusa_choices)}")
        elif a.cmd == "show":
            print(draw(resolve(a.tree)))
        elif a.cmd == "stats":
            vec = rank_vectors_from_file(a.traces)
            hs = head_stats(vec)
            out = {"steps": len(vec), **hs.to_json()}
            if a.tree:
                t = resolve(a.tree)
                out["expected_independent"] = expected_independent(t, hs.accuracy())
                out["expected_empirical"] = expected_empirical(t, vec)
                out["expected_empirical_ci95"] = bootstrap_interval(t, vec)
            print(json.dumps(out))
        elif a.cmd == "optimize":
            vec = rank_vectors_from_file(a.traces)
            acc = head_stats(vec).accuracy()

            def best(n):
                return best_tree_empirical(vec, n) if a.estimator == "empirical" else best_tree_independent(acc, n)

            def est(t):
                return expected_empirical(t, vec) if a.estimator == "empirical" else expected_independent(t, acc)

            n = a.nodes
            if a.latency:
                curve = json.loads(open(a.latency).read())
                n = select_size(lambda k: est(best(k)), [tuple(x) for x in curve], range(1, a.nodes + 1)).nodes
            t = best(n)
            tf = TreeFile(t, num_heads=len(acc), name=a.name, expected_accepted=round(est(t), 4),
                          estimator=a.estimator, source=f"python -m trees optimize --traces {a.traces} --nodes {a.nodes}")
            save_tree(tf, a.out, overwrite=a.overwrite)
            print(json.dumps({"out": a.out, "nodes": len(t), "expected_accepted": tf.expected_accepted}))
        elif a.cmd == "export":
            t = resolve(a.tree)
            print({"trtllm": to_trtllm, "vllm": to_vllm, "json": json.dumps}[a.to](t))
        elif a.cmd == "diff":
            ta, tb = resolve(a.a), resolve(a.b)
            acc = head_stats(rank_vectors_from_file(a.traces)).accuracy() if a.traces else None
            dd = diff(ta, tb, acc)
            print(json.dumps({"added": dd.added, "removed": dd.removed, "kept": dd.kept, "delta_expected": dd.delta_expected}))
    except (TreeError, FileExistsError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
