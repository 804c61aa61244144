"""Head training at scale: the chunked loss, the answer masks, the schedule, budgets, resume and
self-distillation, on tiny random models (CPU)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB

import engine
from engine.heads import MedusaHeads
from engine.loading import load_base
from engine.train.data import Sequences, batches, make_batch, read_distilled, read_sequences
from engine.train.distill import cut_at_eos, self_distill
from engine.train.heads import (
    DECAY,
    IGNORE,
    chunked_head_loss,
    head_targets,
    lr_at,
    train_heads,
)


def random_heads(k=3, layers=2, dim=16, seed=0, vocab=None):
    torch.manual_seed(seed)
    h = MedusaHeads(k, layers, dim, vocab)
    with torch.no_grad():
        h.weight.normal_(0, 0.2)
        h.bias.normal_(0, 0.2)
        if vocab is not None:
            h.proj.normal_(0, 0.3)
    return h


@pytest.mark.parametrize("own_proj", [False, True], ids=["shared-lm-head", "own-projection"])
def test_chunked_loss_equals_the_whole_loss_and_gradient(own_proj):
    """Chunking changes only how much is held at once: loss, per-head losses, hits and the heads'
    gradients (their own vocabulary projections' too, when they have them) equal one unchunked pass
    over [K, N, V] logits."""
    k, n, dim, vocab = 3, 37, 16, 23
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, dim, generator=g)
    lm_head = torch.randn(vocab, dim, generator=g)
    labels = torch.randint(0, vocab, (k, n), generator=g)
    labels[1, -3:] = IGNORE
    labels[2, -6:] = IGNORE
    whole = random_heads(k, dim=dim, vocab=vocab if own_proj else None)
    logits = whole(hidden, lm_head)  # [K, N, V]
    ref = sum(DECAY**i * F.cross_entropy(logits[i], labels[i], ignore_index=IGNORE) for i in range(k))
    ref.backward()
    chunked = random_heads(k, dim=dim, vocab=vocab if own_proj else None)
    loss, per_head, top1, top5 = chunked_head_loss(chunked, lm_head, hidden, labels, chunk=5)
    assert loss == pytest.approx(ref.item(), rel=1e-5)
    for i in range(k):
        assert per_head[i] == pytest.approx(F.cross_entropy(logits[i], labels[i], ignore_index=IGNORE).item(), rel=1e-5)
        valid = labels[i] != IGNORE
        best = logits[i].topk(5, -1).indices
        assert int(top1[i]) == int(((best[:, 0] == labels[i]) & valid).sum())
        assert int(top5[i]) == int(((best == labels[i][:, None]).any(-1) & valid).sum())
    assert torch.allclose(chunked.weight.grad, whole.weight.grad, atol=1e-5)
    assert torch.allclose(chunked.bias.grad, whole.bias.grad, atol=1e-5)
    if own_proj:
        assert torch.allclose(chunked.proj.grad, whole.proj.grad, atol=1e-5)


def test_head_targets_use_model_written_positions_only():
    """Sequence 0: prompt of 3 tokens, answer of 4 (start 3, length 7). Positions t >= 2 with a label
    for head 0 (t + 2 < 7): t = 2, 3, 4. Head k's label at t is token t + k + 2, IGNORE past the end."""
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 0], [20, 21, 22, 23, 24, 25, 26, 27]])
    lengths = torch.tensor([7, 8])
    starts = torch.tensor([3, 0])
    pos, labels = head_targets(tokens, lengths, starts, num_heads=3)
    assert pos.tolist() == [2, 3, 4] + [8 + t for t in range(6)]
    assert labels[0].tolist() == [14, 15, 16, 22, 23, 24, 25, 26, 27]
    assert labels[1].tolist() == [15, 16, IGNORE, 23, 24, 25, 26, 27, IGNORE]
    assert labels[2].tolist() == [16, IGNORE, IGNORE, 24, 25, 26, 27, IGNORE, IGNORE]


def test_schedule_warms_up_then_decays_to_a_tenth():
    assert lr_at(0.0, 1.0, 0.1) == 0.0
    assert lr_at(0.05, 1.0, 0.1) == pytest.approx(0.5)
    assert lr_at(0.1, 1.0, 0.1) == pytest.approx(1.0)
    assert lr_at(1.0, 1.0, 0.1) == pytest.approx(0.1)
    assert lr_at(2.0, 1.0, 0.1) == pytest.approx(0.1)
    mid = [lr_at(p, 1.0, 0.1) for p in np.linspace(0.1, 1.0, 20)]
    assert all(a >= b for a, b in zip(mid, mid[1:]))


def test_batches_cover_every_sequence_once_within_the_token_budget():
    rng = np.random.default_rng(0)
    seqs = Sequences.from_list([list(range(int(n))) for n in rng.integers(5, 120, size=300)], [0] * 300)
    out = batches(seqs, 512, np.random.default_rng(1))
    flat = np.concatenate(out)
    assert sorted(flat.tolist()) == list(range(300))
    assert all(len(b) * seqs.lengths()[b].max() <= 512 or len(b) == 1 for b in out)


def test_sequences_windows_split_first_and_shards_round_trip(tmp_path):
    from engine.train.data import write_shard

    s = Sequences.windows(np.arange(100), 30)
    assert len(s) == 3 and s.get(2).tolist() == list(range(60, 90)) and s.answer_tokens() == 90
    seqs = Sequences.from_list([[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]], [2, 1, 0])
    assert seqs.answer_tokens() == 2 + 2 + 5
    assert len(seqs.first(3)) == 2 and len(seqs.first(1)) == 1 and len(seqs.first(100)) == 3
    rest, held = seqs.split(3)
    assert len(rest) == 2 and held.get(0).tolist() == [8, 9, 10, 11, 12]
    write_shard(tmp_path, 0, seqs)
    write_shard(tmp_path, 1, rest)
    back = read_distilled(tmp_path)
    assert len(back) == 5 and back.get(3).tolist() == [1, 2, 3, 4] and back.answer_start.tolist() == [2, 1, 0, 2, 1]


def test_cut_at_eos_keeps_the_eos():
    assert cut_at_eos([5, 6, 2, 7, 2], {2}) == ([5, 6, 2], True)
    assert cut_at_eos([5, 6], {2}) == ([5, 6], False)


def test_self_distill_writes_the_models_own_greedy_answers_and_resumes(tmp_path, llama_dir):
    eng = engine.load(llama_dir, heads=False, device="cpu")
    eng.eos_ids = {7}
    prompts = [[1, 2, 3], [4, 5], [6, 8, 9, 10], [11], [12, 13]]
    rep = self_distill(eng, prompts[:3], tmp_path / "d", max_new_tokens=6, batch=2, log=lambda *_: None)
    assert rep["prompts_done"] == 3 and rep["sequences"] == 3
    again = self_distill(eng, prompts, tmp_path / "d", max_new_tokens=6, batch=2, log=lambda *_: None)
    assert again["prompts_done"] == 5  # resumed after the first 3
    seqs = read_distilled(tmp_path / "d")
    assert len(seqs) == 5
    for i, p in enumerate(prompts):
        solo = eng.generate(p, 6, mode="ar", stop_on_eos=False).token_ids
        want, _ = cut_at_eos(solo, {7})
        assert seqs.get(i).tolist() == p + want
        assert seqs.answer_start[i] == len(p)


def test_train_heads_learns_resumes_and_stops_on_sigterm(tmp_path, llama_dir):
    """Loss goes down on learnable data; a second call with more epochs continues from the
    checkpoint; a SIGTERM mid-run leaves a checkpoint the same command resumes from."""
    rng = np.random.default_rng(0)
    motif = rng.integers(1, VOCAB, size=40).tolist()
    seqs = Sequences.from_list([motif[i % 7:] + motif for i in range(40)], [3] * 40)
    held = seqs.subset(np.arange(5))
    out = tmp_path / "h.safetensors"
    kw = dict(num_heads=2, batch_tokens=800, lr=3e-3, eval_every=10_000, device="cpu", log=lambda *_: None)
    first = train_heads(str(llama_dir), seqs, held, str(out), epochs=3, **kw)
    assert first["finished"] and first["steps"] == 3 * len(batches(seqs, 800, np.random.default_rng(0)))
    more = train_heads(str(llama_dir), seqs, held, str(out), epochs=12, **kw)
    assert more["steps"] == 4 * first["steps"]  # resumed, not restarted
    assert [h["step"] for h in more["history"]] == [first["steps"], more["steps"]]
    assert more["heldout"][0]["top1"] > first["history"][0]["heldout"][0]["top1"]
    eng = engine.load(llama_dir, heads=out, device="cpu")
    assert eng.num_heads == 2
    # a budgeted run, killed by SIGTERM, then resumed to the end of its budget
    data = tmp_path / "data"
    from engine.train.data import write_shard

    write_shard(data, 0, Sequences.from_list([motif * 3] * 200, [0] * 200))
    # a 6 s budget: SIGTERM lands about 1 s of training in, and the resumed run trains the other 5
    cmd = [sys.executable, "-m", "engine", "train-heads", "--model", str(llama_dir), "--data", str(data),
           "--out", str(tmp_path / "b.safetensors"), "--heads", "2", "--minutes", "0.1", "--batch-tokens", "600",
           "--eval-every", "100000", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "step 1" in line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out_text, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stopped = json.loads(out_text)
    assert not stopped["finished"] and stopped["steps"] >= 1
    assert (tmp_path / "b.safetensors.ckpt.pt").exists()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    resumed = json.loads(done.stdout)
    assert resumed["finished"] and resumed["steps"] > stopped["steps"] and "resumed from" in done.stderr


def test_heads_with_their_own_projection_train_it_and_save_it(tmp_path, llama_dir):
    """`--private-proj`: each head starts from a copy of the base lm_head (Medusa's initialisation)
    and its projection learns; the file is FasterDecoding's layout and loads as such."""
    rng = np.random.default_rng(1)
    motif = rng.integers(1, VOCAB, size=30).tolist()
    seqs = Sequences.from_list([motif[i % 5:] + motif for i in range(30)], [2] * 30)
    out = tmp_path / "own.safetensors"
    train_heads(str(llama_dir), seqs, seqs.subset(np.arange(3)), str(out), num_heads=2, shared_lm_head=False,
                epochs=2, batch_tokens=600, lr=3e-3, eval_every=10_000, device="cpu", log=lambda *_: None)
    eng = engine.load(llama_dir, heads=out, device="cpu")
    lm_head = eng.model.lm_head.weight
    assert eng.heads.proj is not None and eng.heads.proj.shape == (2, *lm_head.shape)
    for k in range(2):
        moved = (eng.heads.proj[k].float() - lm_head.float()).abs().max().item()
        assert moved > 1e-3, (k, moved)  # trained, not the initial copy (fp16 storage alone moves it ~1e-4)


def test_cached_hidden_states_equal_a_forward_per_batch(llama_dir):
    """The cache, built over batches grouped one way, returns for batches grouped another way the
    states a forward of that batch gives, at every kept position (a cut sequence keeps its first
    max_len tokens, as make_batch cuts it)."""
    from engine.train.hidden import HiddenStates

    base, _, _ = load_base(llama_dir, torch.device("cpu"), torch.float32)
    rng = np.random.default_rng(0)
    lengths = [5, 17, 9, 30, 12, 3, 21]
    seqs = Sequences.from_list([rng.integers(1, VOCAB, size=n).tolist() for n in lengths], [0, 2, 1, 4, 0, 1, 3])
    cached = HiddenStates(base, seqs, max_len=20, cache=True, batch_tokens=40)
    plain = HiddenStates(base, seqs, max_len=20, cache=False)
    seen = 0
    for idx in batches(seqs, 64, np.random.default_rng(1)):
        x, lens, _ = make_batch(seqs, idx, 20, "cpu")
        pos = (torch.arange(x.shape[1])[None] < lens[:, None]).flatten().nonzero().squeeze(1)
        torch.testing.assert_close(cached.get(idx, x, pos), plain.get(idx, x, pos), atol=1e-5, rtol=1e-4)
        seen += len(pos)
    assert seen == sum(min(n, 20) for n in lengths) == len(cached.cache)


def test_training_on_cached_hidden_states_equals_training_without(tmp_path, llama_dir):
    """Caching the frozen base's states changes where they come from, not the run: same steps,
    same losses and accuracies, same heads."""
    rng = np.random.default_rng(0)
    seqs = Sequences.from_list([rng.integers(1, VOCAB, size=int(n)).tolist() for n in rng.integers(6, 40, 30)],
                               rng.integers(0, 5, 30).tolist())
    held = seqs.subset(np.arange(4))
    kw = dict(num_heads=2, batch_tokens=200, epochs=2, lr=3e-3, eval_every=10_000, device="cpu", log=lambda *_: None)
    runs = [train_heads(str(llama_dir), seqs, held, str(tmp_path / f"{c}.safetensors"), cache_hidden=c, **kw)
            for c in (False, True)]
    assert [r["settings"]["cache_hidden"] for r in runs] == [False, True]
    assert runs[0]["steps"] == runs[1]["steps"] > 2
    assert runs[0]["heldout"] == runs[1]["heldout"]
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / f"{c}.safetensors")) for c in (False, True))
    for name in a:
        torch.testing.assert_close(a[name].float(), b[name].float(), atol=2e-3, rtol=1e-3)


def test_read_sequences_takes_a_distill_folder_or_text(tmp_path, llama_dir):
    np.save(tmp_path / "tok.npy", np.arange(50) % VOCAB)
    s = read_sequences(tmp_path / "tok.npy", llama_dir, 20, VOCAB)
    assert len(s) == 2 and s.answer_start.tolist() == [0, 0]
    from engine.train.data import write_shard

    write_shard(tmp_path / "d", 0, Sequences.from_list([[1, 2, 3]], [1]))
    assert read_sequences(tmp_path / "d", llama_dir, 20, VOCAB).answer_start.tolist() == [1]


def test_greedy_continuations_equal_generate_without_eos(llama_dir):
    eng = engine.load(llama_dir, heads=False, device="cpu")
    prompts = [[1, 2, 3], [4, 5], [6, 8, 9, 10, 11, 12], [13]]
    bulk = eng.greedy_continuations(prompts, 9)
    assert bulk == [r.token_ids for r in eng.generate(prompts, 9, mode="ar", stop_on_eos=False)]
    assert bulk == [eng.generate(p, 9, mode="ar", stop_on_eos=False).token_ids for p in prompts]
