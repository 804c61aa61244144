"""Which GEMM runs a projection (engine/gemm_choice.py): the choice logic on the CPU, with a fake timer
in place of the graph timing (the kernels themselves, and `auto` on a GPU: tests/test_kernels_gpu.py,
tests/test_graphs_gpu.py)."""

import pytest
import torch
from conftest import make_hf_model
from torch import nn

from engine.config import ModelArgs, ModelLoadError
from engine.gemm_choice import MARGIN, ROW_BUCKETS, TIMED_BYTES, GemmChoice, past_l2, row_bucket
from engine.loading import build_model, fill_model
from engine.tp import TP


def tiny(tmp_path):
    """(ModelArgs, HF state dict) of a tiny random Llama."""
    hf = make_hf_model(tmp_path)
    return ModelArgs.from_hf_config({**hf.config.to_dict(), "model_type": "llama"}, where="tiny"), hf.state_dict()


class FakeTimer:
    """µs per call from a table keyed by (kernel, N): 'cublas' when the call is F.linear, which (like ours and
    the activation kernel) it only records, computing nothing. Records each timing's (kernel, weights, biases,
    input rows), checks the call ran on every pair in turn, and keeps each call's input and whether it was gated
    (`inputs`: ours gets gated=True, cuBLAS the activation's output)."""

    def __init__(self, us: dict):
        self.us, self.calls, self.inputs = us, [], []

    def __call__(self, call, pairs):
        import engine.gemm_choice as gc

        seen = []
        real_linear, real_skinny, real_act = gc.F.linear, gc.gemv.linear, gc.pointwise.silu_mul
        gc.F.linear = lambda x, w, b=None: seen.append(("cublas", x, w, b))
        gc.gemv.linear = lambda x, w, b=None, gated=False: seen.append(("skinny", x, w, b, gated))
        gc.pointwise.silu_mul = lambda gate_up: ("activated", gate_up)
        try:
            for p in pairs:
                call(p)
        finally:
            gc.F.linear, gc.gemv.linear, gc.pointwise.silu_mul = real_linear, real_skinny, real_act
        kind = seen[0][0]
        assert [(id(s[2]), id(s[3])) for s in seen] == [(id(w), id(b)) for w, b in pairs]
        assert {s[0] for s in seen} == {kind}
        x = seen[0][1]
        self.inputs.append((kind, x, seen[0][4] if kind == "skinny" else isinstance(x, tuple)))
        rows = (x[1] if isinstance(x, tuple) else x).shape[0]
        self.calls.append((kind, [id(w) for w, _ in pairs], [id(b) for _, b in pairs], rows))
        return self.us[kind, pairs[0][0].shape[0]]


def test_auto_times_each_shape_and_row_bucket_once_over_every_layer_of_that_shape():
    layers = [nn.Linear(32, 48, bias=i == 0) for i in range(3)] + [nn.Linear(32, 16, bias=False)]
    timer = FakeTimer({("cublas", 48): 10.0, ("skinny", 48): 9.0, ("cublas", 16): 5.0, ("skinny", 16): 6.0})
    choice = GemmChoice("auto", layers, timer=timer, timed_bytes=1)  # 1 byte: the layers alone, no clones
    torch.manual_seed(3)
    assert choice.skinny_wins(layers[1], 1)  # 10 % faster
    drawn = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(4), drawn)  # the timing's input came from its own generator: sampling's is untouched
    assert not choice.skinny_wins(layers[3], 1)  # slower
    assert choice.skinny_wins(layers[0], 1) and choice.skinny_wins(layers[2], 1)  # same key: no new timing
    assert len(timer.calls) == 4
    weights, biases = [id(layer.weight) for layer in layers[:3]], [id(layer.bias) for layer in layers[:3]]
    assert timer.calls[0] == ("cublas", weights, biases, 1)  # all three 48x32 layers in turn, with their biases
    assert timer.calls[1] == ("skinny", weights, biases, 1) and timer.calls[2][:2] == ("cublas", [id(layers[3].weight)])
    choice.skinny_wins(layers[0], 5)  # rows 2-16: the bucket of 16, timed at 16 rows
    choice.skinny_wins(layers[0], 16)
    choice.skinny_wins(layers[0], 40)
    assert [c[3] for c in timer.calls[4:]] == [16, 16, 64, 64]
    clones = FakeTimer({("cublas", 48): 10.0, ("skinny", 48): 9.0})
    GemmChoice("auto", layers[:3], timer=clones, timed_bytes=7 * 48 * 32 * 4).skinny_wins(layers[0], 1)
    timed = clones.calls[0][1]  # the three layers, then clones of them in turn, up to the bytes asked for
    assert len(timed) == 7 and timed[:3] == weights and not set(timed[3:]) & set(weights)
    assert [(c["N"], c["rows"], c["kernel"]) for c in choice.chosen()] == [(16, 1, "cublas"), (48, 1, "skinny"),
                                                                           (48, 16, "skinny"), (48, 64, "skinny")]


def test_the_down_projection_is_timed_with_its_activation():
    """`gated`: the down projection's choice compares cuBLAS after the SiLU * up kernel against ours applying it
    as it loads its input: both timed on one [rows, 2K] gate_up input, under a key of their own (the same shape
    ungated is another choice)."""
    down = nn.Linear(40, 16, bias=False)
    timer = FakeTimer({("cublas", 16): 10.0, ("skinny", 16): 9.0})
    choice = GemmChoice("auto", [down], timer=timer, timed_bytes=1)
    assert choice.skinny_wins(down, 1, gated=True)
    (cublas, x_c, act_c), (ours, x_o, gated_o) = timer.inputs
    assert (cublas, ours) == ("cublas", "skinny") and act_c and gated_o  # cuBLAS read the activation's output
    assert x_c[1] is x_o and x_o.shape == (1, 80)  # one gate_up input, 2K wide
    choice.skinny_wins(down, 1)  # ungated: a timing of its own, on a K-wide input
    assert len(timer.inputs) == 4 and timer.inputs[2][1].shape == (1, 40) and not timer.inputs[3][2]
    assert [(c["rows"], c["gated"]) for c in choice.chosen()] == [(1, False), (1, True)]


def test_row_buckets():
    from engine.kernels import gemv

    assert [row_bucket(r) for r in (1, 2, 16, 17, 32, 33, 64)] == [1, 16, 16, 32, 32, 64, 64]
    assert ROW_BUCKETS[-1] == gemv.MAX_ROWS  # every row count the kernel takes has a bucket


@pytest.mark.parametrize("ours, wins", [(10.0 * (1 - MARGIN) - 0.01, True), (10.0 * (1 - MARGIN) + 0.01, False),
                                        (10.0, False)])
def test_a_near_tie_goes_to_cublas(ours, wins):
    """Ours must win by MARGIN: a tie or a hair's gain keeps cuBLAS."""
    layer = nn.Linear(8, 24, bias=False)
    choice = GemmChoice("auto", [layer], timer=FakeTimer({("cublas", 24): 10.0, ("skinny", 24): ours}), timed_bytes=1)
    assert choice.skinny_wins(layer, 3) is wins


def test_timed_weights_are_cloned_past_the_l2():
    """A small model's weights would sit in L2 when timed in a loop; clones (and their biases) bring them to
    TIMED_BYTES, the originals first."""
    pairs = [(torch.zeros(1024, 1024), torch.zeros(1024)), (torch.zeros(1024, 1024), None)]  # 4 MB each
    out = past_l2(pairs)
    assert out[:2] == pairs and len(out) == TIMED_BYTES // (4 << 20)
    assert out[2][0] is not pairs[0][0] and torch.equal(out[2][0], pairs[0][0]) and out[2][1] is not None
    assert out[3][1] is None
    big = [(torch.zeros(1, 1), None)]
    assert past_l2(big, nbytes=2) == big


def test_modes_and_the_cpu_path(tmp_path):
    """On the CPU (and wherever the kernel does not apply) every mode runs the layer itself and times nothing;
    an unknown mode is a one-line error at the model's construction too."""
    layer = nn.Linear(8, 24)
    x = torch.randn(2, 8)
    for mode in ("cublas", "skinny", "auto"):
        timer = FakeTimer({})
        choice = GemmChoice(mode, [layer], timer=timer)
        assert torch.equal(choice.linear(layer, x), layer(x)) and timer.calls == []
        assert choice._ours(layer, torch.randn(2, 16), gated=True) is False and timer.calls == []
    with pytest.raises(ValueError, match="gemm must be one of cublas, skinny, auto, not 'fast'"):
        GemmChoice("fast", [])
    with pytest.raises(ModelLoadError, match="gemm must be one of cublas, skinny, auto, not 'fast'"):
        build_model(tiny(tmp_path)[0], gemm="fast")


def test_the_model_gathers_every_layers_projections(tmp_path):
    """A fused model's choice sees all four projections of every layer (so `auto` times a shape over all of them)
    and the lm_head; cuBLAS needs none."""
    args, sd = tiny(tmp_path)
    for gemm, made in (("cublas", False), ("auto", True)):
        model, _, _ = fill_model(build_model(args, fused=True, gemm=gemm), sd.items(), "cpu", torch.float32, "tiny")
        choice = model._gemm_choice()
        assert (choice is not None) == made
        if made:
            assert sum(len(ps) for ps in choice.layers.values()) == 4 * args.n_layers + 1
            assert model.lm_head in choice.layers[tuple(model.lm_head.weight.shape)]
            assert choice is model._gemm_choice()  # made once
    # under tensor parallelism the replicated lm_head stays on cuBLAS: each rank would choose and tune its own
    # kernel, and the ranks' logits must agree
    model, _, _ = fill_model(build_model(args, TP(group=True), fused=True, gemm="auto"), sd.items(), "cpu",
                             torch.float32, "tiny")
    assert sum(len(ps) for ps in model._gemm_choice().layers.values()) == 4 * args.n_layers
