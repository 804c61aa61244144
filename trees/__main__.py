"""`python -m trees validate|show|stats|optimize|experiment|dynamic|export|diff` (docs/estimators.md).

Every user error is one `error: ...` line and exit status 2; a bug says `internal error` (exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from . import (
    MAX_DEPTH,
    MAX_TOPK,
    JsonInputError,
    TraceError,
    TreeError,
    TreeFile,
    ar_runs,
    best_tree,
    compare_trees,
    cross_validate,
    diff,
    estimate,
    export_warnings,
    head_stats,
    latency_points,
    load_tree,
    pair_measured,
    paired,
    read_json_file,
    read_runs,
    resolve,
    save_tree,
    select_size,
    static_vs_dynamic,
    to_trtllm,
    to_vllm,
    validate,
)
from .dynamic import RULES as DYNAMIC_RULES
from .estimate import MAX_BOOTSTRAP, Replay


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def draw(choices: list[list[int]]) -> str:
    """Text drawing: one line per node, indented by depth, labelled head/rank; depth-first (paths
    in lexicographic order) so every node sits under its parent."""
    lines = ["root"]
    for p in sorted(choices):
        lines.append("  " * len(p) + f"└ h{len(p) - 1} r{p[-1]}  {p}")
    return "\n".join(lines)


def _argument(parse, ok, want: str):
    """An argparse type: `parse` the text, then `ok` must hold; `want` names what is expected."""
    def read(text: str):
        try:
            v = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text}")
        return v

    return read


_positive = _argument(int, lambda v: v >= 1, "a positive integer")
_seconds = _argument(float, lambda v: math.isfinite(v) and v > 0, "a positive number of seconds")
_samples = _argument(int, lambda v: 0 <= v <= MAX_BOOTSTRAP, f"bootstrap resamples 0..{MAX_BOOTSTRAP}")


def _sizes(text: str) -> list[int]:
    sizes = [_positive(x) for x in text.split(",") if x.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError(f"expected comma-separated node counts, got {text!r}")
    return sizes


def _rules(text: str) -> list[str]:
    rules = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [r for r in rules if r not in DYNAMIC_RULES]
    if unknown or not rules:
        raise argparse.ArgumentTypeError(f"unknown dynamic-tree rule {unknown[0] if unknown else text!r}; choose from "
                                         f"{', '.join(DYNAMIC_RULES)}")
    return rules


def _ar(paths: str | list[str]) -> list:
    runs = []
    for path in [paths] if isinstance(paths, str) else paths:
        found = ar_runs(read_runs(path))
        if not found:
            raise TraceError(f"{path}: no AR runs with head top-k (collect them with `python -m engine collect-traces`)")
        runs += found
    return runs


def _estimates(tree, runs, samples: int, replay=None) -> dict:
    return {e: estimate(tree, runs, e, samples=samples, replay=replay).to_json() for e in ("replay", "position", "independent")}


def cmd_validate(a) -> None:
    tf = load_tree(a.file)
    topk = a.topk if a.topk is not None else tf.topk
    num_heads = a.num_heads if a.num_heads is not None else tf.num_heads
    try:
        validate(tf.medusa_choices, topk=topk, num_heads=num_heads)
    except TreeError as e:
        raise TreeError(f"{a.file}: {e}") from None
    print(f"{a.file}: ok, {len(tf.medusa_choices)} nodes, depth {max(len(x) for x in tf.medusa_choices)}, topk {topk}")


def cmd_stats(a) -> None:
    """Head statistics pooled over every file given (each file's own run and step counts listed)."""
    per_file = {path: _ar(path) for path in a.traces}
    runs = [r for found in per_file.values() for r in found]
    vec = [v for r in runs for v in r.vectors]
    out = {"runs": len(runs), "steps": len(vec),
           "files": [{"path": path, "runs": len(found), "steps": sum(r.n_steps for r in found)}
                     for path, found in per_file.items()],
           **head_stats(vec).to_json()}
    if a.tree:
        out["estimates"] = _estimates(resolve(a.tree), runs, a.samples)
    print(json.dumps(out))


def _search_options(a) -> dict:
    """The optimiser's keyword arguments from --topk, --max-depth and --time-limit."""
    if a.time_limit is not None and a.method != "replay":
        raise ValueError(f"--time-limit bounds the replay optimiser's local search; --method {a.method} is best-first "
                         "and needs none")
    if a.topk > MAX_TOPK or (a.max_depth or 0) > MAX_DEPTH:
        raise ValueError(f"--topk is at most {MAX_TOPK} and --max-depth at most {MAX_DEPTH}")
    kw = {"topk": a.topk, "max_depth": a.max_depth}
    if a.time_limit is not None:
        kw["time_limit"] = a.time_limit
    return kw


def cmd_optimize(a) -> None:
    runs = _ar(a.traces)
    kw = _search_options(a)
    n = a.nodes
    size = None
    if a.latency:
        try:
            points = latency_points(read_json_file(a.latency))
        except JsonInputError as e:
            raise ValueError(str(e)) from None
        rp = Replay(runs)
        trees_of: dict[int, list[list[int]]] = {}

        def e_of(k: int) -> float:
            trees_of[k] = best_tree(runs, k, a.method, replay=rp, **kw) if a.method == "replay" else \
                best_tree(runs, k, a.method, **kw)
            return estimate(trees_of[k], runs, "replay", samples=0, replay=rp).value

        size = select_size(e_of, points, a.nodes)
        if size.nodes == 0:
            raise ValueError(f"AR is fastest on this latency curve ({size.tokens_per_s} tokens/s predicted): no tree "
                             "pays; not writing one")
        n = size.nodes
    t = best_tree(runs, n, a.method, **kw)
    est = estimate(t, runs, "replay", samples=a.samples)
    extra = {"estimate": est.to_json()}
    if a.folds:
        extra["cross_validated"] = {k: v for k, v in cross_validate(runs, n, a.method, a.folds, **kw).items()
                                    if k != "tree"}
    if size is not None:
        extra["size_choice"] = {"nodes": size.nodes, "predicted_tokens_per_s": size.tokens_per_s,
                                "margin_over_runner_up": size.margin, "runner_up": size.runner_up, "curve": size.curve}
    limits = "".join(f" --{flag} {value}" for flag, value in (("topk", a.topk), ("max-depth", a.max_depth),
                                                               ("time-limit", a.time_limit)) if value is not None)
    tf = TreeFile(t, num_heads=max(len(p) for p in t), topk=a.topk, name=a.name, expected_accepted=round(est.value, 4),
                  estimator="replay", source=f"python -m trees optimize --traces {' '.join(a.traces)} --nodes {a.nodes} "
                  f"--method {a.method}{limits}", extra=extra)
    save_tree(tf, a.out, overwrite=a.overwrite)
    print(json.dumps({"out": a.out, "nodes": len(t), "expected_accepted": tf.expected_accepted, **extra}))


def _parse_tree_spec(spec: str) -> tuple[str, list[list[int]], str | None]:
    """'TREE' or 'TREE:MEASURED.jsonl' (TREE a preset or a tree file)."""
    name, _, measured = spec.partition(":")
    return name, resolve(name), measured or None


def cmd_experiment(a) -> None:
    """Per tree: measured tokens/step (its Medusa-run traces) against every estimator's prediction,
    from the tune traces (held out) and, for the replay, from the test prompts' own AR traces (in
    sample: equal, for greedy). With --medusa-tune (typical / sample runs of a bigger tree on the tune
    prompts), the step-start estimate of each tree that is a subtree of it. With --paired, every tree
    against the first on the same prompts (`trees.compare`)."""
    if not (a.traces_tune and a.traces_test) and not a.medusa_tune:
        raise ValueError("give --traces-tune and --traces-test (greedy), or --medusa-tune (typical / sample)")
    tune = _ar(a.traces_tune) if a.traces_tune else None
    test = _ar(a.traces_test) if a.traces_test else None
    rp_tune, rp_test = (Replay(tune) if tune else None), (Replay(test) if test else None)
    medusa_tune = [r for r in read_runs(a.medusa_tune) if r.mode == "medusa"] if a.medusa_tune else None
    out: dict = {"trees": {}}
    if tune:
        out["tune"] = {"runs": len(tune), "tokens": rp_tune.tokens()}
        out["test"] = {"runs": len(test), "tokens": rp_test.tokens()}
    if medusa_tune:
        out["medusa_tune"] = {"runs": len(medusa_tune), "acceptance": medusa_tune[0].acceptance,
                              "tree_nodes": len(medusa_tune[0].tree or [])}
    chosen: dict[str, tuple[list[list[int]], list | None]] = {}  # name -> (tree, its measured Medusa runs)
    for spec in a.tree:
        name, tree, measured_file = _parse_tree_spec(spec)
        row: dict = {"nodes": len(tree)}
        runs = None
        m = None
        if measured_file:
            runs = [r for r in read_runs(measured_file) if r.mode == "medusa"]
            if not runs:
                raise TraceError(f"{measured_file}: no Medusa runs")
            if any(r.tree and sorted(map(tuple, r.tree)) != sorted(map(tuple, tree)) for r in runs):
                raise ValueError(f"{measured_file}: its runs decoded with another tree than {name}")
            tokens, steps = sum(r.n_tokens for r in runs), sum(r.n_steps for r in runs)
            m = tokens / steps
            row["measured"] = {"tokens_per_step": round(m, 4), "runs": len(runs), "tokens": tokens,
                               "acceptance": runs[0].acceptance}
        if tune:
            row["from_test_traces"] = _estimates(tree, test, a.samples, rp_test)
            row["from_tune_traces"] = _estimates(tree, tune, a.samples, rp_tune)
            if m is not None:
                row["error_pct"] = {e: {"in_sample": round(100 * (row["from_test_traces"][e]["value"] / m - 1), 2),
                                        "heldout": round(100 * (row["from_tune_traces"][e]["value"] / m - 1), 2)}
                                    for e in ("replay", "position", "independent")}
            # prompts per set for a 3 % held-out replay error at 95 %: scale the bootstrap half-widths
            half = [(est["ci95"][1] - est["ci95"][0]) / 2 / est["value"] for est in
                    (row["from_test_traces"]["replay"], row["from_tune_traces"]["replay"]) if est["ci95"]]
            if len(half) == 2:
                combined = math.sqrt(half[0] ** 2 + half[1] ** 2)
                row["replay_heldout_halfwidth_pct"] = round(100 * combined, 2)
                row["prompts_per_set_for_3pct"] = math.ceil(min(len(tune), len(test)) * (combined / 0.03) ** 2)
        if medusa_tune:
            try:
                est = estimate(tree, medusa_tune, "step-start", samples=a.samples)
                row["from_medusa_tune_traces"] = {"step-start": est.to_json()}
                if m is not None:
                    row.setdefault("error_pct", {})["step-start"] = {"heldout": round(100 * (est.value / m - 1), 2)}
            except ValueError as e:
                row["from_medusa_tune_traces"] = {"step-start": None, "why": str(e)}
        out["trees"][name] = row
        chosen[name] = (tree, runs)
    if a.paired:
        out["paired"] = _paired(chosen, test, rp_test, a.samples)
    print(json.dumps(out))


def _paired(chosen: dict, test, rp_test, samples: int) -> dict:
    """Each tree against the first, on the same prompts: replayed on the test AR traces, and measured
    where both trees have Medusa traces whose runs pair up by prompt hash."""
    if len(chosen) < 2:
        raise ValueError("--paired compares every --tree with the first: give at least two")
    (base, (base_tree, base_runs)), *others = chosen.items()
    out = {}
    for name, (tree, runs) in others:
        row: dict = {}
        if test:
            row["replay_on_test_traces"] = compare_trees(test, base_tree, tree, samples, replay=rp_test).to_json()
        if base_runs and runs:
            try:
                row["measured"] = paired(*pair_measured(base_runs, runs), samples).to_json()
            except ValueError as e:
                row["measured"] = {"why": str(e)}
        out[f"{name} vs {base}"] = row
    return out


def cmd_dynamic(a) -> None:
    """Static against dynamic trees of equal sizes on the test AR traces (`trees.static_vs_dynamic`)."""
    kw = _search_options(a)
    test = _ar(a.traces_test)
    tune = _ar(a.traces_tune) if a.traces_tune else None
    rows = static_vs_dynamic(test, a.nodes, tune, a.rules, a.samples, time_limit=a.time_limit or 30.0,
                             topk=kw["topk"], max_depth=kw["max_depth"])
    print(json.dumps({"test_runs": len(test), "tune_runs": len(tune) if tune else None, "sizes": rows}))


def cmd_diff(a) -> None:
    ta, tb = resolve(a.a), resolve(a.b)
    est = None
    if a.traces:
        rp = Replay(_ar(a.traces))

        def est(t):
            return rp.tokens() / rp.steps({tuple(p) for p in t})

    dd = diff(ta, tb, est)
    print(json.dumps({"added": dd.added, "removed": dd.removed, "kept": dd.kept, "delta_expected_replay": dd.delta_expected}))


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m trees", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="check a tree file against every rule (its own topk/num_heads unless given)")
    v.add_argument("file")
    v.add_argument("--topk", type=_positive, default=None)
    v.add_argument("--num-heads", type=_positive, default=None)
    s = sub.add_parser("show", help="draw a tree")
    s.add_argument("tree", help="preset name, JSON file or inline JSON")
    st = sub.add_parser("stats", help="head accuracies; with --tree, its tokens/step by every estimator")
    st.add_argument("traces", nargs="+", help="AR trace files (pooled)")
    st.add_argument("--tree", default=None)
    st.add_argument("--samples", type=_samples, default=1000, help="bootstrap resamples over runs")
    o = sub.add_parser("optimize", help="the best tree of --nodes nodes for these traces")
    o.add_argument("--traces", required=True, nargs="+", help="AR trace files (pooled)")
    o.add_argument("--nodes", type=_positive, default=64)
    o.add_argument("--method", choices=["replay", "position", "independent"], default="replay",
                   help="objective: replay (exact for greedy; local search), or best-first under the position-averaged "
                        "or independent estimate")
    o.add_argument("--latency", default=None,
                   help="`bench --part latency` JSON: choose the size (up to --nodes) by replayed E(n)/t(n) at measured sizes")
    o.add_argument("--topk", type=_positive, default=10, help="candidates per head a node may use (ranks 0..topk-1)")
    o.add_argument("--max-depth", type=_positive, default=None, help="deepest path (default: the heads the traces hold)")
    o.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="stop the replay optimiser's local search after this long (checked between its rounds)")
    o.add_argument("--folds", type=int, default=0, help="also report k-fold held-out tokens/step")
    o.add_argument("--samples", type=_samples, default=1000)
    o.add_argument("--name", default="optimised")
    o.add_argument("--out", required=True)
    o.add_argument("--overwrite", action="store_true")
    x = sub.add_parser("experiment", help="measured vs predicted tokens/step per tree and estimator, in and out of sample")
    x.add_argument("--traces-tune", default=None, help="AR traces of the prompts trees are tuned on")
    x.add_argument("--traces-test", default=None, help="AR traces of other prompts of the same kind")
    x.add_argument("--medusa-tune", default=None,
                   help="typical / sample: Medusa-run traces (with accept_prob) of a tree containing the others, on tune prompts")
    x.add_argument("--tree", action="append", required=True, metavar="TREE[:MEASURED.jsonl]",
                   help="a preset or tree file, with the Medusa-run traces of it on the test prompts")
    x.add_argument("--samples", type=_samples, default=1000)
    x.add_argument("--paired", action="store_true",
                   help="also compare every tree with the first on the same prompts (gain with a bootstrap interval)")
    y = sub.add_parser("dynamic", help="static vs dynamic trees (a tree drafted per step) at equal node counts")
    y.add_argument("--traces-test", required=True, nargs="+", help="AR traces with head probabilities to replay on")
    y.add_argument("--traces-tune", default=None, nargs="+",
                   help="AR traces to optimise the static trees and calibrate on (default: the test traces, in sample)")
    y.add_argument("--nodes", type=_sizes, default=[8, 16, 32, 64], help="comma-separated sizes (default 8,16,32,64)")
    y.add_argument("--rules", type=_rules, default=list(DYNAMIC_RULES), help="comma-separated: product,calibrated")
    y.add_argument("--topk", type=_positive, default=10)
    y.add_argument("--max-depth", type=_positive, default=None)
    y.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="per static tree's local search (default 30)")
    y.add_argument("--samples", type=_samples, default=1000)
    y.set_defaults(method="replay")
    e = sub.add_parser("export", help="print a tree for another engine")
    e.add_argument("tree")
    e.add_argument("--to", choices=["trtllm", "vllm", "json"], required=True)
    d = sub.add_parser("diff", help="what going from tree A to tree B adds and removes")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--traces", default=None, help="AR traces: also the change in replayed tokens/step")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "validate":
            cmd_validate(a)
        elif a.cmd == "show":
            print(draw(resolve(a.tree)))
        elif a.cmd == "stats":
            cmd_stats(a)
        elif a.cmd == "optimize":
            cmd_optimize(a)
        elif a.cmd == "experiment":
            cmd_experiment(a)
        elif a.cmd == "dynamic":
            cmd_dynamic(a)
        elif a.cmd == "export":
            t = resolve(a.tree)
            print({"trtllm": to_trtllm, "vllm": to_vllm, "json": json.dumps}[a.to](t))
            if warnings := export_warnings(t, a.to):
                sys.stderr.write(f"warning: {'; '.join(warnings)}\n")
        elif a.cmd == "diff":
            cmd_diff(a)
    except (TreeError, TraceError, JsonInputError, FileExistsError, ValueError, OSError) as err:
        sys.stderr.write(f"error: {' '.join(str(err).splitlines())}\n")
        return 2
    except Exception as err:  # a bug
        sys.stderr.write(f"internal error: {type(err).__name__}: {err} (a bug: please report it with the command line)\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
