"""Design, validate, score, optimise and export Medusa `medusa_choices` trees.

Needs only torch and the standard library; imports nothing from engine/ or workbench/.
"""

from .buffers import TreeBuffers, buffers, pack_mask_bits
from .compare import Paired, compare_trees, pair_measured, paired, static_vs_dynamic
from .dynamic import Calibration, dynamic_walk, estimate_dynamic, step_tree
from .estimate import (
    ESTIMATORS,
    Estimate,
    Replay,
    bootstrap,
    estimate,
    expected_independent,
    expected_position,
    expected_replay,
    expected_step_start,
    path_probability,
)
from .io import (
    DEFAULT_TOPK,
    JsonInputError,
    OutputPathError,
    TreeFile,
    check_output_file,
    export_warnings,
    from_counts,
    load_tree,
    open_for_reading,
    parse_json,
    parse_tree,
    read_json_file,
    read_text_file,
    save_tree,
    to_trtllm,
    to_vllm,
    write_atomic,
)
from .optimize import (
    SizeChoice,
    best_tree,
    best_tree_independent,
    best_tree_position,
    cross_validate,
    diff,
    latency_points,
    optimize_replay,
    select_size,
)
from .presets import DEFAULT_TREE, chain, kary, names, preset, register
from .stats import HeadStats, Run, TraceError, ar_runs, head_stats, rank_vectors, read_runs, run_of_steps
from .tree import MAX_DEPTH, MAX_NODES, MAX_TOPK, TreeError, sort_paths, validate


def resolve(tree: object, topk: int | None = None, num_heads: int | None = None) -> list[list[int]]:
    """A preset name, a JSON file, inline JSON text, a schema-1 dict or a list of paths -> validated
    paths (None: the default tree). Files and dicts are checked against their own topk and
    num_heads first, then everything against the caller's: `topk` None keeps the tree's own (a
    file's `topk`, 10 for a bare list or a preset), as `trees validate` does; the engine passes its own."""
    import os

    if tree is None:
        tree = DEFAULT_TREE
    if isinstance(tree, str) and tree.lstrip().startswith(("[", "{")):  # inline JSON (never Python)
        try:
            tree = parse_json(tree, "tree")
        except JsonInputError as e:
            raise TreeError(str(e)) from None
    own = DEFAULT_TOPK
    if isinstance(tree, (str, os.PathLike)):
        s = os.fspath(tree)
        if s.endswith(".json") or os.path.sep in s or os.path.exists(s):
            tf = load_tree(s)
            tree, own = tf.medusa_choices, tf.topk
        else:
            tree = preset(s)
    elif isinstance(tree, (dict, TreeFile)):
        tf = parse_tree(tree) if isinstance(tree, dict) else tree
        tree, own = tf.medusa_choices, tf.topk
    return [list(p) for p in validate(tree, topk=own if topk is None else topk, num_heads=num_heads)]


__all__ = [
    "DEFAULT_TOPK", "DEFAULT_TREE", "ESTIMATORS", "MAX_DEPTH", "MAX_NODES", "MAX_TOPK", "Calibration", "Estimate",
    "HeadStats", "JsonInputError", "OutputPathError", "Paired", "Replay", "Run", "SizeChoice", "TraceError",
    "TreeBuffers", "TreeError", "TreeFile", "ar_runs", "best_tree", "best_tree_independent", "best_tree_position",
    "bootstrap", "buffers", "chain", "check_output_file", "compare_trees", "cross_validate", "diff", "dynamic_walk",
    "estimate", "estimate_dynamic", "expected_independent", "expected_position", "expected_replay",
    "expected_step_start", "export_warnings", "from_counts", "head_stats", "kary", "latency_points", "load_tree",
    "names", "open_for_reading", "optimize_replay", "pack_mask_bits", "pair_measured", "paired", "parse_json",
    "parse_tree", "path_probability", "preset", "rank_vectors", "read_json_file", "read_runs", "read_text_file",
    "register", "resolve", "run_of_steps", "save_tree", "select_size", "sort_paths", "static_vs_dynamic", "step_tree",
    "to_trtllm", "to_vllm", "validate", "write_atomic",
]
