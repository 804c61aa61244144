"""Bad input everywhere: one clear line (exit 2) or a message, never a traceback; resources bounded
before allocation; nothing lost; and the next request works."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import make_hf_model, random_heads_sd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import engine
import trees
from engine import GenerationError, ModelLoadError
from engine.loading import DEMO_DIR
from workbench.core import EDITOR

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=40,
)
DEEP = "[" * 200_000 + "]" * 200_000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the bad-input corpus over every command line ----------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Files for the corpus: deep JSON, wrong traces and latency files, broken configs, a FIFO."""
    d = tmp_path_factory.mktemp("corpus")
    (d / "deep.json").write_text(DEEP)
    (d / "empty_tree.json").write_text("[]")
    (d / "heads_minus1.json").write_text(json.dumps({"medusa_choices": [[0]], "num_heads": -1}))
    (d / "topk3.json").write_text(json.dumps({"medusa_choices": [[0], [5]], "topk": 3}))
    (d / "ok_tree.json").write_text("[[0], [1]]")
    lines = {"trace_str_tokens.jsonl": '{"accepted_tokens": "abc"}',
             "trace_bad_head.jsonl": '{"accepted_tokens": [1], "head_topk": [[{"tok": 1}]]}',
             "trace_list.jsonl": "[1, 2, 3]",
             "trace_no_tokens.jsonl": '{"step": 0, "tree": []}',
             "trace_deep.jsonl": DEEP,
             "trace_bad_prob.jsonl": '{"accepted_tokens": [1], "accept_prob": ["x"]}'}
    for name, text in lines.items():
        (d / name).write_text(text + "\n")
    (d / "latency_bad.json").write_text('[[1, 5], [2, "x"]]')
    (d / "latency_deep.json").write_text(DEEP)
    make_hf_model(d / "model", "llama", n_kv=2)
    save_file(random_heads_sd(), str(d / "model" / "medusa_lm_head.safetensors"))
    base = json.loads((d / "model" / "config.json").read_text())
    for name, change in (("cfg_list", None), ("cfg_zero_heads", {"num_attention_heads": 0}),
                         ("cfg_str_hidden", {"hidden_size": "64"}),
                         ("cfg_linear_no_factor", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}),
                         ("cfg_huge_layers", {"num_hidden_layers": 10**7}), ("cfg_deep", "deep")):
        m = d / name
        m.mkdir()
        text = DEEP if change == "deep" else json.dumps([base] if change is None else {**base, **change})
        (m / "config.json").write_text(text)
        for f in (d / "model").iterdir():
            if f.name != "config.json":
                (m / f.name).symlink_to(f)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "rope_theta": 1e4}
    for name, change in (("cfg_llama3_null", {"rope_parameters": {**llama3, "low_freq_factor": None}}),
                         ("cfg_llama3_list", {"rope_parameters": {**llama3, "factor": [8.0]}}),
                         ("cfg_llama3_flat", {"rope_parameters": {**llama3, "low_freq_factor": 4.0}}),
                         ("cfg_tie_str", {"tie_word_embeddings": "false"}), ("cfg_bias_int", {"attention_bias": 0})):
        _variant(d, name, {**base, **change})
    weights = load_file(str(d / "model" / "model.safetensors"))
    for name, shard in (("wm_int", 5), ("wm_up", "../model/model.safetensors"), ("wm_list", ["model.safetensors"])):
        _variant(d, name, base, skip=("model.safetensors",))
        (d / name / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard for k in weights}}))
    _variant(d, "int8", base, skip=("model.safetensors",))
    save_file({**weights, "model.norm.weight": weights["model.norm.weight"].to(torch.int8)},
              str(d / "int8" / "model.safetensors"))
    _variant(d, "dup", base, skip=("model.safetensors",))  # one weight in two shards: which wins would be a guess
    keys = sorted(weights)
    save_file({k: weights[k] for k in keys[: len(keys) // 2 + 1]}, str(d / "dup" / "model-00001-of-00002.safetensors"))
    save_file({k: weights[k] for k in keys[len(keys) // 2:]}, str(d / "dup" / "model-00002-of-00003.safetensors"))
    heads = random_heads_sd()
    save_file({**heads, "0.0.linear.weight": heads["0.0.linear.weight"].to(torch.int8)}, str(d / "heads_int8.safetensors"))
    save_file({("00" + k[1:] if k.startswith("0.0.") else k): v for k, v in heads.items()}, str(d / "heads_00.safetensors"))
    save_file({**heads, "00.0.linear.bias": heads["0.0.linear.bias"].clone()}, str(d / "heads_beside.safetensors"))
    for name, template in (("chat_unparsable", "{% for m in messages %}{{ m.content }"),
                           ("chat_raises", "{{ raise_exception('this template takes no user turns') }}")):
        m = d / name
        m.mkdir()
        for f in ("config.json", "model.safetensors", "tokenizer.json", "medusa_heads.safetensors"):
            (m / f).symlink_to(DEMO_DIR / f)
        cfg = json.loads((DEMO_DIR / "tokenizer_config.json").read_text())
        (m / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    (d / "latency_inf.json").write_text('{"points": [{"nodes": 0, "step_ms": Infinity}, {"nodes": 4, "step_ms": Infinity}]}')
    (d / "medusa_short_prob.jsonl").write_text("\n".join(json.dumps(x) for x in (
        {"type": "header", "mode": "medusa", "acceptance": "typical"},
        {"step": 0, "accepted_tokens": [1, 2], "accepted_nodes": [0, 1], "tree": [[0], [1], [0, 0]],
         "accept_prob": [None, 0.5]})) + "\n")
    (d / "topk20.json").write_text(json.dumps({"medusa_choices": [[0], [15]], "topk": 20}))
    import numpy as np

    np.save(d / "ids_past_vocab.npy", np.array([1, 2, 3] * 200 + [10**6], dtype=np.int64))
    for name in ("fifo.json", "fifo.jsonl", "fifo.safetensors", "fifo.npy", "fifo_out.json", "fifo_out.jsonl",
                 "fifo_out.safetensors"):
        os.mkfifo(d / name)
    (d / "a_dir").mkdir()
    (d / "earlier_traces.jsonl").write_text('{"type": "header", "mode": "ar"}\n')
    return d


def _variant(d, name, config, skip=()):
    """A copy of the corpus model (files linked) with its own config.json, leaving out `skip`."""
    m = d / name
    m.mkdir()
    (m / "config.json").write_text(json.dumps(config))
    for f in (d / "model").iterdir():
        if f.name != "config.json" and f.name not in skip:
            (m / f.name).symlink_to(f)


def _run_cli(module: str, argv: list[str], capsys) -> tuple[int, str]:
    """Run `python -m MODULE argv` in process; -> (exit status, stderr)."""
    if module == "engine":
        from engine.cli import main
    else:
        from trees.__main__ import main
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def bad_cases(d):
    m = str(d / "model")
    return [  # (module, argv, what the one line says)
        ("trees", ["optimize", "--traces", "x.jsonl", "--nodes", "0", "--out", str(d / "o.json")], "positive integer"),
        ("trees", ["optimize", "--traces", "x.jsonl", "--nodes", "-1", "--out", str(d / "o.json")], "positive integer"),
        ("trees", ["validate", str(d / "empty_tree.json")], "tree is empty"),
        ("trees", ["validate", str(d / "deep.json")], "nested too deeply"),
        ("trees", ["show", str(d / "deep.json")], "nested too deeply"),
        ("trees", ["diff", str(d / "deep.json"), "chain_2"], "nested too deeply"),
        ("trees", ["validate", str(d / "heads_minus1.json")], "num_heads must be a positive integer"),
        ("trees", ["validate", str(d / "topk3.json")], "rank 5 is outside [0, 3)"),
        ("trees", ["validate", str(d / "fifo.json")], "not a regular file"),
        ("trees", ["validate", str(d / "a_dir")], "is a directory"),
        *[("trees", [cmd, "--traces" if cmd != "stats" else str(d / name), *( [str(d / name)] if cmd != "stats" else []),
                     *(["--out", str(d / "o.json")] if cmd == "optimize" else [])], "error")
          for cmd in ("stats", "optimize") for name in ("trace_str_tokens.jsonl", "trace_bad_head.jsonl",
                                                         "trace_list.jsonl", "trace_no_tokens.jsonl", "trace_deep.jsonl",
                                                         "trace_bad_prob.jsonl")],
        ("trees", ["diff", "chain_2", "chain_3", "--traces", str(d / "trace_list.jsonl")], "must be a JSON object"),
        ("trees", ["optimize", "--traces", str(ROOT + "/models/demo/tune_traces.jsonl"), "--latency",
                   str(d / "latency_bad.json"), "--out", str(d / "o.json")], "latency point"),
        ("trees", ["optimize", "--traces", str(ROOT + "/models/demo/tune_traces.jsonl"), "--latency",
                   str(d / "latency_deep.json"), "--out", str(d / "o.json")], "nested too deeply"),
        ("engine", ["generate", "--prompt", "x", "--tree", "[]", "--device", "cpu"], "tree is empty"),
        ("engine", ["generate", "--prompt", "x", "--tree", str(d / "deep.json"), "--device", "cpu"], "nested too deeply"),
        ("engine", ["generate", "--prompt", "x", "--tree", DEEP[:5000] + DEEP[-5000:], "--device", "cpu"], "nested"),
        ("engine", ["generate", "--prompt", "x", "--tree", str(d / "fifo.json"), "--device", "cpu"], "not a regular file"),
        ("engine", ["generate", "--prompt", "x", "--trace", str(d / "a_dir"), "--device", "cpu"], "is a directory"),
        ("engine", ["collect-traces", "--out", str(d / "a_dir"), "--device", "cpu"], "is a directory"),
        ("engine", ["collect-traces", "--out", str(d / "c.jsonl"), "--prompts", "-1"], "integer >= 0"),
        ("engine", ["collect-traces", "--out", str(d / "earlier_traces.jsonl"), "--device", "cpu"], "pass --append"),
        ("engine", ["collect-traces", "--out", str(d / "c.jsonl"), "--prompts", "0", "--device", "cpu"], "at least 1"),
        ("engine", ["convert-heads", str(d / "model"), "--to", "safetensors", "--out", str(d / "a_dir")], "is a directory"),
        ("engine", ["convert-heads", "x", "--to", "safetensors", "--out", "y", "--tp", "0"], "positive integer"),
        ("engine", ["generate", "--prompt", "x", "--device", "bogus"], "unknown device"),
        ("engine", ["generate", "--prompt", "x", "--device", "cuda"], "no CUDA"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--backend", "triton"], "needs a CUDA device"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--backend", "flash_attn"], "needs a CUDA device"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--seed", str(2**70)], "seed must be"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--tp", "0"], "positive integer"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--max-seq-len", "0"], "positive integer"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--max-new-tokens", "-3"], "positive integer"),
        ("engine", ["eval-heads", "--data", "x.txt", "--seq", "0"], "positive integer"),
        *[("engine", ["generate", "--model", str(d / name), "--prompt-ids", "1,2", "--device", "cpu"], want)
          for name, want in (("cfg_list", "expected a JSON object"), ("cfg_zero_heads", "num_attention_heads must be"),
                             ("cfg_str_hidden", "hidden_size must be"), ("cfg_linear_no_factor", "needs 'factor'"),
                             ("cfg_huge_layers", "num_hidden_layers must be"), ("cfg_deep", "nested too deeply"))],
        ("engine", ["generate", "--model", m, "--prompt-ids", "1,2", "--device", "cpu", "--tree", str(d / "topk3.json")],
         "rank 5 is outside"),
        ("engine", ["inspect", str(d / "nope")], "no such file"),
        # round 3: hostile files, counts checked before products, crashes that became one line
        *[("trees", [cmd, *args], "not a regular file") for cmd, args in (
            ("stats", [str(d / "fifo.jsonl")]), ("optimize", ["--traces", str(d / "fifo.jsonl"), "--out", str(d / "o.json")]),
            ("optimize", ["--traces", ROOT + "/models/demo/tune_traces.jsonl", "--nodes", "4", "--out",
                          str(d / "fifo_out.json"), "--overwrite"]))],
        *[("engine", argv, "not a regular file") for argv in (
            ["inspect", str(d / "fifo.safetensors")],
            ["generate", "--prompt", "x", "--device", "cpu", "--trace", str(d / "fifo_out.jsonl")],
            ["collect-traces", "--out", str(d / "fifo_out.jsonl"), "--device", "cpu", "--prompts", "1"],
            ["eval-heads", "--model", m, "--data", str(d / "fifo.npy"), "--device", "cpu"],
            ["generate", "--model", m, "--heads", str(d / "fifo.safetensors"), "--prompt-ids", "1,2", "--device", "cpu"],
            ["convert-heads", str(d / "model"), "--to", "safetensors", "--out", str(d / "fifo_out.safetensors")])],
        ("trees", ["stats", ROOT + "/models/demo/tune_traces.jsonl", "--samples", str(10**9)], "bootstrap resamples 0..100000"),
        ("trees", ["optimize", "--traces", ROOT + "/models/demo/tune_traces.jsonl", "--latency", str(d / "latency_inf.json"),
                   "--out", str(d / "o.json")], "step_ms a number in"),
        ("trees", ["experiment", "--medusa-tune", str(d / "medusa_short_prob.jsonl"), "--tree", "[[0], [1], [0, 0]]"],
         "'accept_prob' has 2 entries"),
        ("engine", ["bench", "--threads", str(10**9)], "--threads 1000000000 is more"),
        ("engine", ["eval-heads", "--model", m, "--data", str(d / "ids_past_vocab.npy"), "--device", "cpu", "--seq", "8"],
         "token id 1000000 is outside the model's vocabulary"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--accept", "sample", "--top-p", "1e-46"], "top_p must be"),
        ("engine", ["generate", "--prompt", "x", "--device", "cpu", "--accept", "sample", "--temperature", "1e-50"],
         "temperature must be 0 (greedy) or at least"),
        *[("engine", ["generate", "--model", str(d / name), "--prompt", "x", "--chat", "--device", "cpu"],
           "chat template failed") for name in ("chat_unparsable", "chat_raises")],
        *[("engine", ["generate", "--model", str(d / name), "--prompt-ids", "1,2", "--device", "cpu"], want)
          for name, want in (("cfg_llama3_null", "rope low_freq_factor must be a positive number, got None"),
                             ("cfg_llama3_list", "rope factor must be a positive number, got [8.0]"),
                             ("cfg_llama3_flat", "high_freq_factor > low_freq_factor"),
                             ("cfg_tie_str", "tie_word_embeddings must be true or false, got 'false'"),
                             ("cfg_bias_int", "attention_bias must be true or false, got 0"),
                             ("wm_int", "weight_map['lm_head.weight'] is 5"),
                             ("wm_up", "expected a .safetensors file name in the model directory"),
                             ("wm_list", "weight_map['lm_head.weight'] is ['model.safetensors']"),
                             ("int8", "'model.norm.weight' is int8; weights must be float32"),
                             ("dup", "duplicates"))],
        *[("engine", ["generate", "--model", m, "--heads", str(d / name), "--prompt-ids", "1,2", "--device", "cpu"], want)
          for name, want in (("heads_int8.safetensors", "'0.0.linear.weight' is int8"),
                             ("heads_00.safetensors", "'00.0.linear.bias' matches no Medusa head format"),
                             ("heads_beside.safetensors", "'00.0.linear.bias' matches no Medusa head format"))],
        ("engine", ["convert-heads", str(d / "heads_int8.safetensors"), "--to", "safetensors", "--out", str(d / "c.st")],
         "is int8; weights must be float32"),
    ]


def test_every_bad_input_is_one_line_and_exit_2(corpus, capsys):
    cases = bad_cases(corpus)
    assert len(cases) >= 84
    for module, argv, want in cases:
        code, err = _run_cli(module, argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and want in lines[0], (module, argv, err)
        assert "Traceback" not in err


def test_a_bug_is_called_internal_error_with_what_to_report(monkeypatch, capsys):
    import engine.cli

    def boom(*a, **k):
        raise KeyError("something that should never happen")

    monkeypatch.setattr(engine.cli, "_generate", boom)
    code, err = _run_cli("engine", ["generate", "--prompt", "x"], capsys)
    assert code == 1 and err.startswith("internal error: KeyError") and "a bug: please report it" in err


def test_non_utf8_argv_and_a_bad_port_are_one_line():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "engine", "generate", "--prompt", b"\xff\xfe bad".decode("utf-8",
                          "surrogateescape"), "--device", "cpu"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120, errors="replace")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "not valid Unicode" in lines[0], out.stderr
    out = subprocess.run([sys.executable, "app.py", "--port", "99999"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "a port is in 1..65535" in lines[0], out.stderr


# -- fuzzing ---------------------------------------------------------------------------------------------
@FUZZ
@given(value=json_values)
def test_any_json_as_a_tree_gives_a_verdict_never_an_exception(tabs, value):
    msg, fig, normal = tabs.editor.validate_tree(json.dumps(value))
    assert msg.startswith(("✓", "✗"))
    assert (fig is None) == msg.startswith("✗") == (normal is None)


@FUZZ
@given(text=st.text(max_size=200))
def test_any_text_as_a_tree_gives_a_verdict(tabs, text):
    assert tabs.editor.validate_tree(text)[0].startswith(("✓", "✗"))


@FUZZ
@given(lines=st.lists(json_values, min_size=1, max_size=5))
def test_any_trace_lines_read_or_say_which_line(tmp_path_factory, lines):
    f = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    try:
        runs = trees.read_runs(f)
    except trees.TraceError as e:
        assert str(f) in str(e)
    else:
        for r in runs:
            assert r.n_tokens >= 0 and isinstance(r.vectors, list)


@FUZZ
@given(value=json_values)
def test_any_latency_file_is_read_or_refused(value):
    try:
        points = trees.latency_points(value)
    except ValueError as e:
        assert str(e)
    else:
        assert all(isinstance(n, int) and v["step_ms"] > 0 for n, v in points.items())


@FUZZ
@given(change=st.dictionaries(st.sampled_from(["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads", "intermediate_size", "head_dim", "rope_scaling",
                                                "rope_theta", "max_position_embeddings", "eos_token_id", "rms_norm_eps",
                                                "sliding_window"]), json_values, max_size=3))
def test_any_config_json_is_read_or_refused(change):
    base = {"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128}
    try:
        args = engine.ModelArgs.from_hf_config({**base, **change})
    except ModelLoadError as e:
        assert str(e).startswith("config.json")
    else:
        assert args.n_heads % args.n_kv_heads == 0 and args.head_dim % 2 == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.tuples(json_values, json_values, json_values, json_values))
def test_app_handlers_answer_anything_with_a_message(tabs, wb, args):
    s = wb.sessions.get("fuzz")
    a, b, c, d = args
    for out in (tabs.editor.edit_tree(a, b if isinstance(b, str) else "add child", c, d), tabs.editor.save_tree(a, b, bool(c)),
                tabs.editor.export_tree(a, b if isinstance(b, str) else "vllm"), tabs.editor.diff_trees(a, b, c),
                tabs.tune.optimize_tree(s, a, b if isinstance(b, str) else "replay"), tabs.decode.load_run(s, a), tabs.tune.use_pool(s, a)):
        assert out is not None
    for x in (a, b):
        assert isinstance(tabs.editor.validate_tree(x)[0], str)
    ev = list(tabs.decode.decode(s, "def f():\n", a, b, "medusa", "greedy", 0.7, 1.0, 0, 2))
    assert "error" in ev[0] or ev[-1]["done"]
    res = tabs.api.generate(s, "x", a if isinstance(a, str) else "demo_tuned", c if isinstance(c, str) else "medusa",
                          "greedy", d, 1.0, None, 2)
    assert "error" in res or "token_ids" in res
    try:
        wb.prompt_set(a, b, c, d)
    except ValueError as e:  # UserError
        assert str(e)


def test_truncated_deep_huge_and_out_of_range_trees(tabs, wb, tmp_path):
    f = tmp_path / "t.json"
    trees.save_tree(trees.TreeFile(trees.preset("mc_sim_7b_63"), num_heads=4, name="t"), f)
    text = f.read_text()
    for cut in range(1, len(text) - 1, 37):
        (tmp_path / "cut.json").write_text(text[:cut])
        with pytest.raises(trees.TreeError):
            trees.load_tree(tmp_path / "cut.json")
    deep = [[0] * d for d in range(1, 2000)]
    with pytest.raises(trees.TreeError, match="exceeds the limit of 64"):
        trees.validate(deep)
    assert "depth 5 exceeds the 4 heads" in tabs.editor.validate_tree(json.dumps(deep))[0]
    big = [[a, b, c] for a in range(10) for b in range(10) for c in range(10)]
    msg = tabs.editor.validate_tree(json.dumps(big))[0]
    ev = list(tabs.decode.decode(wb.sessions.get("x"), "x", EDITOR, json.dumps(big), max_new_tokens=4))
    assert "more than 511 nodes" in msg and "more than 511 nodes" in ev[0]["error"]  # editor and decode agree
    assert "nested too deeply" in tabs.editor.validate_tree(DEEP)[0]
    assert "too many digits" in tabs.editor.validate_tree("[[" + "9" * 5000 + "]]")[0]  # a verdict, not a crash
    for bad, rule in (([[10]], "rank"), ([[-1]], "rank"), ([[0.5]], "integer"), ([["0"]], "integer"), ([[]], "empty"),
                      ([[0], [0]], "duplicate"), ({"medusa_choices": "[[0]]"}, "list"), ([], "empty")):
        msg = tabs.editor.validate_tree(json.dumps(bad))[0]
        assert msg.startswith("✗") and rule in msg.lower(), (bad, msg)


def test_validators_agree_everywhere(tabs, demo_engine, tmp_path):
    """The trees CLI, the engine, and the editor's validator and save refuse the same trees."""
    from trees.__main__ import main as trees_main

    for bad in ([], [[0], [0, 0, 0, 0, 0]], [[i] for i in range(600)], [[10]]):
        f = tmp_path / "t.json"
        f.write_text(json.dumps({"medusa_choices": bad, "num_heads": 4, "topk": 10}))
        with pytest.raises(GenerationError):
            demo_engine.generate("x", 2, tree=bad)
        assert trees_main(["validate", str(f)]) == 2
        assert tabs.editor.validate_tree(json.dumps(bad))[0].startswith("✗")
        assert tabs.editor.save_tree("x", json.dumps(bad))[0].startswith("✗")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.one_of(st.text(max_size=300), st.sampled_from(["", " ", "\n\t\r", "\x00" * 40, "\u202e\u0301" * 30,
                                                                  "🙂" * 50, "a\x1b[2J" * 20, "\ud800 lone"])))
def test_any_prompt_decodes_or_says_why(tabs, wb, prompt):
    events = list(tabs.decode.decode(wb.sessions.get("prompts"), prompt, "demo_tuned", "", max_new_tokens=2))
    assert events and ("error" in events[0] or events[-1]["done"])
    if "error" in events[0]:
        assert events[0]["error"] in ("the prompt is empty", "the prompt is not valid Unicode text (it holds a lone "
                                      "surrogate)") or "exceeds the context" in events[0]["error"]
        assert "internal error" not in events[0]["error"]


def test_megabyte_prompt_is_refused_and_the_app_keeps_serving(tabs, wb, demo_engine):
    s = wb.sessions.get("mb")
    before = list(tabs.decode.decode(s, "def f(x):\n", "demo_tuned", "", max_new_tokens=12))[-1]["html"]
    ev = list(tabs.decode.decode(s, "x" * 1_000_000, "demo_tuned", "", max_new_tokens=4))
    assert "limit is 20000" in ev[0]["error"]
    with pytest.raises(GenerationError, match="exceeds the context"):
        demo_engine.generate("def f():\n" * 100_000, 4)
    assert list(tabs.decode.decode(s, "def f(x):\n", "demo_tuned", "", max_new_tokens=12))[-1]["html"] == before


@FUZZ
@given(n=st.one_of(st.integers(-10**6, 10**6), st.just(0), st.floats(), st.booleans(), st.text(max_size=3)),
       temperature=st.one_of(st.floats(), st.just(0.0), st.just(-1.0)),
       top_k=st.integers(-5, 10**6), top_p=st.floats(-1, 2))
def test_any_generation_settings_run_or_raise_generation_error(demo_engine, n, temperature, top_k, top_p):
    try:
        res = demo_engine.generate("import os\n", n, mode="medusa", accept="sample", temperature=temperature,
                                   top_k=top_k, top_p=top_p, seed=0)
    except GenerationError as e:
        assert str(e)
    else:
        assert isinstance(n, int) and 1 <= n and res.new_tokens <= n


def test_simulated_out_of_memory_is_refused_and_serving_continues(demo_engine, monkeypatch):
    before = demo_engine.generate("def f(x):\n", 8).token_ids
    encoded = []
    monkeypatch.setattr(demo_engine, "encode", lambda *a, **k: encoded.append(1) or [1])
    with pytest.raises(GenerationError, match="out of memory: a KV cache for 300000 x"):
        demo_engine.generate(["x"] * 300_000, 4, mode="ar")
    assert not encoded  # refused before tokenising 300,000 prompts (seconds of work for nothing)
    monkeypatch.undo()
    assert demo_engine.generate("def f(x):\n", 8).token_ids == before


# -- model and heads files --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    make_hf_model(root / "ok", "llama")
    save_file(random_heads_sd(dim=32), str(root / "heads_dim32.safetensors"))
    save_file(random_heads_sd(vocab=50), str(root / "heads_vocab50.safetensors"))
    (root / "corrupt.safetensors").write_bytes(os.urandom(3000))
    import argparse

    torch.save({"0.0.linear.weight": torch.zeros(2, 2), "x": argparse.Namespace(a=1)}, root / "pickle.pt")
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / "notes.txt").write_text("hello")
    corrupt = root / "corrupt_model"
    make_hf_model(corrupt, "llama")
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 100)
    many = {f"{h}.0.linear.weight": torch.zeros(1, 1) for h in range(20_000)}
    many.update({f"{h}.0.linear.bias": torch.zeros(1) for h in range(20_000)})
    save_file(many, str(root / "many_heads.safetensors"))
    return root


CASES = [
    ({"model": "missing_dir"}, "no such model directory"),
    ({"model": "not_a_model"}, "no config.json"),
    ({"model": "corrupt_model"}, "cannot read weights"),
    ({"model": "ok", "heads": "heads_dim32.safetensors"}, "the base model needs"),
    ({"model": "ok", "heads": "heads_vocab50.safetensors"}, "the base model needs"),
    ({"model": "ok", "heads": "corrupt.safetensors"}, "cannot read weights"),
    ({"model": "ok", "heads": "pickle.pt"}, "cannot read weights"),
    ({"model": "ok", "heads": "nope.safetensors"}, "no such heads file"),
    ({"model": "ok", "heads": "many_heads.safetensors"}, "at most 64 heads"),
]


@pytest.mark.parametrize("case,msg", CASES, ids=[m for _, m in CASES])
def test_bad_model_and_head_files_raise_model_load_error(bad_models, case, msg):
    with pytest.raises(ModelLoadError, match=msg):
        engine.load(bad_models / case["model"], heads=bad_models / case["heads"] if "heads" in case else None, device="cpu")


def test_twenty_thousand_heads_are_refused_from_the_header_alone(bad_models):
    """The shapes are read from the safetensors header: refused before a tensor is read or made."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="20000 heads"):
        engine.load(bad_models / "ok", heads=bad_models / "many_heads.safetensors", device="cpu")
    assert time.perf_counter() - t0 < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: no 11.8 GB allocation


def test_a_killed_run_keeps_every_traced_step(tmp_path):
    f = tmp_path / "t.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "engine", "generate", "--prompt", "def main():\n", "--max-new-tokens",
                          "900", "--device", "cpu", "--trace", str(f)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd=ROOT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (not f.exists() or f.read_text().count("\n") < 6):
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
    lines = f.read_text().splitlines()
    assert len(lines) >= 6 and p.returncode == -signal.SIGKILL
    rows = [json.loads(line) for line in lines]  # every line written is a whole step
    assert rows[0]["type"] == "header" and [r["step"] for r in rows[1:]] == list(range(len(rows) - 1))


def test_orphan_temp_files_are_cleaned_and_saved_trees_are_readable(tmp_path, demo_engine):
    from workbench.store import Store

    (tmp_path / "trees").mkdir()
    (tmp_path / "trees" / ".x.json.abc.tmp").write_text("half a tree")
    (tmp_path / ".staging").mkdir()
    (tmp_path / ".staging" / ".y.json.def.tmp").write_text("half")
    store = Store(tmp_path)
    assert not list(tmp_path.rglob("*.tmp"))
    path = store.save_tree(trees.TreeFile([[0]], name="ok"))
    assert oct(os.stat(path).st_mode & 0o777) == "0o644" and not list(store.trees_dir.glob(".*"))


def test_live_app_under_concurrency_cancel_stop_and_faults():
    from workbench.loadtest import report, run

    # half the sizes of benchmarks/reliability.md's smallest run: every part runs, CI stays short
    # the many-heads file's memory is pinned by test_twenty_thousand_heads_are_refused_from_the_header_alone
    # the page that is not stopped decodes 300 tokens, not 1,000: its run waits behind the stopped one on the one
    # engine, and what is checked is that it is not ended with it, whatever its length (at 1,000, it and the solo
    # run it must equal took 9-10 s each on 2 cores)
    out = run(sessions=6, sequential=5, tokens=8, streamed=4, flood=12, others=6, distinct=6, soak_minutes=0.1,
              many_heads_file=False, stop_other_tokens=300)
    md = report(out, "loadtest")  # the markdown of benchmarks/reliability.md renders every part
    assert "distinct sessions" in md and "Soak:" in md and "killed 1 s into" in md
    dropped = out["dropped_client"]
    assert dropped["finish"] == "user" and dropped["tokens_decoded"] < 900, dropped
    assert out["distinct_sessions"]["failed"] == 0
    assert out["soak"]["requests"]["unexpected"] == 0 and out["soak"]["requests"]["generate"] > 0, out["soak"]
    assert "| saved tree | 200 |" in md and "5 sequential requests: 0 outputs" in md
    assert out["concurrent"] == {**out["concurrent"], "completed": 6, "identical_to_single": 6}
    assert out["cancel"]["next_run_ok"]
    assert all(f["as_expected"] and f["next_good_run_unchanged"] for f in out["faults"]), out["faults"]
    assert out["sequential"]["mismatches"] == 0
    access = out["file_access"]  # only saved trees come back through the file route; uploads are bounded
    assert access["saved tree"] == 200 and access["upload 10 KB"] == 200, access
    refused = ("upload 2 MB", "20 files of 1 MB in one request", "a 1.2 MB file after a 0.6 MB one")
    assert all(access[name] == 413 for name in refused), access
    assert access.pop("temp files kept by the refused uploads") == 0
    assert access["a temp file in staging"] in (403, 404)
    assert all(code in (403, 404) for name, code in access.items() if name not in (
        "saved tree", "upload 10 KB", *refused)), access
    assert out["flood"]["crashed"] == 0 and out["flood"]["answered"] == out["flood"]["sessions"]
    if "stop_isolation" not in out:  # the Stop button's parts drive a browser
        pytest.skip("the Stop parts need chromium (apt-get install -y chromium); every other part passed")
    iso = out["stop_isolation"]  # B had not ended when A stopped, then ended complete and equal to a solo run
    assert iso["other_pending_at_stop"] and iso["other_complete_and_equal_to_solo"], iso
    assert "stopped by user" in out["stop_isolation"]["stopped_stats"] and "stopped by user" in md
    stop = out["stop_after_sessions"]  # the run that outlived 6 other sessions could still be stopped
    assert stop["others_answered"] == 6 and stop["run_still_going_at_stop"] and "stopped by user" in stop["stats"], stop


# -- round 3: validation before allocation, only regular files, API types ----------------------------
def _peak_bytes(fn) -> int:
    """Peak Python allocation while fn runs (tracemalloc): a bound on the work done, not a timing."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    except ValueError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_counts_are_checked_before_their_product_is_built():
    with pytest.raises(trees.TreeError, match=r"each in \[1, 1024\]"):
        trees.from_counts([1, 4000, 4000])  # built 16 M paths before refusing them, once
    with pytest.raises(trees.TreeError, match="more than 511 nodes"):
        trees.from_counts([1, 1024, 1024])
    assert _peak_bytes(lambda: trees.from_counts([1, 1024, 1024])) < 1_000_000
    assert trees.from_counts([1, 2, 3]) == [[0], [1]] + [[a, b] for a in range(2) for b in range(3)]
    with pytest.raises(ValueError, match="samples must be"):
        trees.estimate([[0]], trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl")), samples=10**9)
    runs = trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl"))[:3]
    with pytest.raises(ValueError, match="samples must be"):  # every bootstrap, not only estimate's
        trees.compare_trees(runs, trees.preset("chain_1"), trees.preset("chain_2"), samples=10**9)


def test_a_trace_line_is_bounded_while_it_is_read(tmp_path):
    from trees.stats import MAX_TRACE_LINE

    f = tmp_path / "one_line.jsonl"
    f.write_text("[" * (3 * MAX_TRACE_LINE))  # 24 MiB and no newline
    with pytest.raises(trees.TraceError, match=r"one_line.jsonl:1: a line longer than"):
        trees.read_runs(f)
    assert _peak_bytes(lambda: trees.read_runs(f)) < 3 * MAX_TRACE_LINE  # the whole line was read once


def test_only_regular_files_are_read_or_replaced(tmp_path):
    import stat

    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(trees.TraceError, match="not a regular file"):  # once: a hang until a writer came
        trees.read_runs(fifo)
    for target in (fifo, tmp_path):
        with pytest.raises(trees.OutputPathError):
            trees.save_tree(trees.TreeFile([[0]]), target, overwrite=True)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # never replaced
    node = tmp_path / "null_node"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is, in a folder of ours
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    from trees.__main__ import main as trees_main

    assert trees_main(["optimize", "--traces", str(DEMO_DIR / "tune_traces.jsonl"), "--nodes", "4", "--out", str(node),
                       "--overwrite"]) == 2
    assert stat.S_ISCHR(os.stat(node).st_mode)  # `--out /dev/null --overwrite` as root replaced the real one


def test_engine_api_types_are_checked(demo_engine):
    with pytest.raises(GenerationError, match="not bytes"):
        demo_engine.generate(b"def f():", 4)  # bytes were decoded as token ids
    with pytest.raises(GenerationError, match="stop_on_eos must be true or false"):
        demo_engine.generate("def f():", 4, stop_on_eos="false")  # a non-empty string was true
    for kw, msg in ((dict(temperature=1e-50), "temperature must be 0"), (dict(top_p=1e-46), "top_p must be")):
        with pytest.raises(GenerationError, match=msg):
            demo_engine.generate("def f():", 4, accept="sample", **kw)


def test_a_txt_prompt_file_is_text_and_trees_commands_accept_what_validate_accepts(tmp_path, capsys):
    from engine.prompts import read_prompts
    from trees.__main__ import main as trees_main

    f = tmp_path / "p.txt"
    f.write_text('{"prompt": "not JSON lines: a .txt file is text"}\n---\ndef g():\n')
    assert [p.text for p in read_prompts(f)] == ['{"prompt": "not JSON lines: a .txt file is text"}\n', "def g():\n"]
    tree = tmp_path / "topk20.json"
    tree.write_text(json.dumps({"medusa_choices": [[0], [15]], "topk": 20}))
    for argv in (["validate", str(tree)], ["show", str(tree)], ["export", str(tree), "--to", "trtllm"]):
        assert trees_main(argv) == 0, capsys.readouterr().err
    assert "[[0],[15]]" in capsys.readouterr().out
