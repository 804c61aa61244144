"""Tensor parallelism on CPU: gloo, world size 2, spawned processes, fp32; outputs equal tp=1."""

import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from conftest import VOCAB, make_hf_model, random_heads_sd
from safetensors import safe_open
from safetensors.torch import save_file

import engine
from engine.config import ModelLoadError
from engine.loading import DEMO_DIR, load_base
from engine.prompts import heldout_prompts
from engine.tp import TP, shard_dim

RUNS = [("ar", None), ("medusa", "mc_sim_7b_63"), ("medusa", "chain_3")]


def decode_all(eng, prompts) -> dict:
    out = {f"{mode}:{tree}": [eng.generate(p, 24, mode=mode, tree=tree).token_ids for p in prompts] for mode, tree in RUNS}
    out["batch"] = [r.token_ids for r in eng.generate(prompts, 24, mode="medusa", tree="mc_sim_7b_63")]
    out["sample"] = eng.generate(prompts[0], 24, mode="medusa", accept="sample", temperature=0.8, seed=5).token_ids
    return out


def case_prompts(name):
    if name == "demo":
        return heldout_prompts(2)
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (6, 11)]


def worker(rank, world, rdv, cases, out_dir):
    torch.distributed.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world)
    try:
        result = {}
        for name, path in cases:
            eng = engine.load(path, device="cpu", dtype="float32", tp=TP(rank, world))
            _, _, nbytes = load_base(engine.loading.resolve_model_dir(path), "cpu", torch.float32, TP(rank, world))
            result[name] = {"bytes": nbytes, **decode_all(eng, case_prompts(name))}
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)  # results are written: skip C++ static destructors, which can abort a gloo worker at exit


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    made = []
    for name, n_kv, heads in (("mha", 4, dict(vocab=VOCAB)), ("gqa", 2, dict(vocab=None, num_layers=2))):
        d = tmp_path_factory.mktemp(name)
        make_hf_model(d, "llama", n_kv=n_kv)
        file = "medusa_lm_head.safetensors" if heads["vocab"] else "medusa_heads.safetensors"
        save_file(random_heads_sd(**heads), str(d / file))
        made.append((name, str(d)))
    made.append(("demo", str(DEMO_DIR)))
    return made


def test_tp2_equals_tp1_and_reads_only_its_slices(cases, tmp_path):
    mp.spawn(worker, args=(2, str(tmp_path / "rdv"), cases, tmp_path), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name, path in cases:
        eng = engine.load(path, device="cpu", dtype="float32")
        want = decode_all(eng, case_prompts(name))
        for r in ranks:
            got = dict(r[name])
            got.pop("bytes")
            assert got == want, name
        # each rank read the replicated tensors whole and half of every split one
        whole = split = 0
        with safe_open(str(engine.loading.base_weight_files(engine.loading.resolve_model_dir(path))[0]), "pt") as f:
            for key in f.keys():
                t = f.get_slice(key)
                n = torch.Size(t.get_shape()).numel() * {"F32": 4, "F16": 2, "BF16": 2}[t.get_dtype()]
                split, whole = (split + n, whole) if shard_dim(engine.loading.strip_prefix(key)) is not None else (split, whole + n)
        assert split > 0
        assert [r[name]["bytes"] for r in ranks] == [whole + split // 2] * 2


def test_tp_that_does_not_divide_the_heads_is_a_clear_error(cases):
    _, path = cases[0]
    with pytest.raises(ModelLoadError, match="--tp 3 does not divide num_attention_heads = 4"):
        load_base(engine.loading.resolve_model_dir(path), "cpu", torch.float32, TP(0, 3))


def test_torchrun_cli_prints_once_and_matches_tp1(cases):
    import subprocess
    import sys
    from pathlib import Path

    _, path = cases[1]
    cmd = ["-m", "engine", "generate", "--model", path, "--prompt-ids", "5,17,33,2", "--max-new-tokens", "16",
           "--device", "cpu", "--dtype", "float32", "--json", "--tree", "chain_3"]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    eng = engine.load(path, device="cpu", dtype="float32")
    want = eng.generate([5, 17, 33, 2], 16, mode="medusa", tree="chain_3").token_ids
    out = subprocess.run([torchrun, "--nproc-per-node", "2", *cmd, "--tp", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(s) for s in out.stdout.splitlines() if s.startswith("{")]
    assert len(lines) == 1 and lines[0]["token_ids"] == want
    alone = subprocess.run([sys.executable, *cmd, "--tp", "2"], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 2 and "--tp 2 needs exactly 2 processes" in alone.stderr
