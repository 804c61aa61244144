"""Design, validate, score, optimise and export Medusa `medusa_choices` trees.

Needs only torch and the standard library; imports nothing from engine/ or workbench/.
"""

from .buffers import TreeBuffers, buffers, pack_mask_bits
from .estimate import accepted_lengths, bootstrap_interval, expected_empirical, expected_independent, path_probability
from .io import TreeFile, from_counts, load_tree, parse_tree, save_tree, to_trtllm, to_vllm
from .optimize import best_tree_empirical, best_tree_independent, diff, select_size
from .presets import DEFAULT_TREE, chain, kary, names, preset, register
from .stats import HeadStats, head_stats, rank_vectors, rank_vectors_from_file, read_traces, split_runs
from .tree import TreeError, sort_paths, validate


def resolve(tree: object, topk: int = 10, num_heads: int | None = None) -> list[list[int]]:
    """A preset name, a path to a JSON file, a schema-1 dict or a list of paths -> validated paths."""
    import os

    if tree is None:
        tree = DEFAULT_TREE
    if isinstance(tree, (str, os.PathLike)):
        s = os.fspath(tree)
        if s.endswith(".json") or os.path.sep in s or os.path.exists(s):
            tree = load_tree(s).medusa_choices
        else:
            tree = preset(s)
    elif isinstance(tree, (dict, TreeFile)):
        tree = parse_tree(tree).medusa_choices if isinstance(tree, dict) else tree.medusa_choices
    return [list(p) for p in validate(tree, topk=topk, num_heads=num_heads)]


__all__ = [
    "TreeBuffers", "TreeError", "TreeFile", "HeadStats", "DEFAULT_TREE",
    "accepted_lengths", "best_tree_empirical", "best_tree_independent", "bootstrap_interval", "buffers",
    "chain", "diff", "expected_empirical", "expected_independent", "from_counts", "head_stats", "kary",
    "load_tree", "names", "pack_mask_bits", "parse_tree", "path_probability", "preset", "rank_vectors",
    "rank_vectors_from_file", "read_traces", "register", "resolve", "save_tree", "select_size",
    "sort_paths", "split_runs", "to_trtllm", "to_vllm", "validate",
]
