"""Which GEMM runs a projection (engine/gemm_choice.py): the choice logic on the CPU, with a fake timer
in place of the graph timing (the kernels themselves: tests/test_kernels_gpu.py)."""

import pytest
import torch
from conftest import make_hf_model
from torch import nn

from engine.config import ModelArgs, ModelLoadError
from engine.gemm_choice import MARGIN, GemmChoice
from engine.loading import build_model, fill_model


def tiny(tmp_path):
    """(ModelArgs, HF state dict) of a tiny random Llama."""
    hf = make_hf_model(tmp_path)
    return ModelArgs.from_hf_config({**hf.config.to_dict(), "model_type": "llama"}, where="tiny"), hf.state_dict()


class FakeTimer:
    """µs per call from a table keyed by (kernel, N): 'cublas' when the call is F.linear, which (like ours) it
    only records, computing nothing. Records each timing's weights, and checks the call ran on every one."""

    def __init__(self, us: dict):
        self.us, self.calls = us, []

    def __call__(self, call, weights):
        import engine.gemm_choice as gc

        seen = []
        real_linear, real_skinny = gc.F.linear, gc.gemv.linear
        gc.F.linear = lambda x, w, b=None: seen.append(("cublas", w))
        gc.gemv.linear = lambda x, w, b=None: seen.append(("skinny", w))
        try:
            for w in weights:
                call(w)
        finally:
            gc.F.linear, gc.gemv.linear = real_linear, real_skinny
        kind = seen[0][0]
        assert [id(w) for _, w in seen] == [id(w) for w in weights] and {k for k, _ in seen} == {kind}
        self.calls.append((kind, [id(w) for w in weights]))
        return self.us[kind, weights[0].shape[0]]


def test_auto_times_each_shape_and_row_count_once_over_every_weight_of_that_shape():
    layers = [nn.Linear(32, 48, bias=False) for _ in range(3)] + [nn.Linear(32, 16, bias=False)]
    timer = FakeTimer({("cublas", 48): 10.0, ("skinny", 48): 9.0, ("cublas", 16): 5.0, ("skinny", 16): 6.0})
    choice = GemmChoice("auto", [layer.weight for layer in layers], timer=timer)
    torch.manual_seed(3)
    assert choice.skinny_wins(layers[1].weight, 1)  # 10 % faster
    drawn = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(4), drawn)  # the timing's input came from its own generator: sampling's is untouched
    assert not choice.skinny_wins(layers[3].weight, 1)  # slower
    assert choice.skinny_wins(layers[0].weight, 1) and choice.skinny_wins(layers[2].weight, 1)  # same key: no new timing
    assert len(timer.calls) == 4
    assert timer.calls[0] == ("cublas", [id(layer.weight) for layer in layers[:3]])  # all three 48x32 weights, in turn
    assert timer.calls[1][0] == "skinny" and timer.calls[2] == ("cublas", [id(layers[3].weight)])
    choice.skinny_wins(layers[0].weight, 5)  # another row count: timed again
    assert len(timer.calls) == 6
    assert [(c["N"], c["rows"], c["kernel"]) for c in choice.chosen()] == [(16, 1, "cublas"), (48, 1, "skinny"),
                                                                           (48, 5, "skinny")]


@pytest.mark.parametrize("ours, wins", [(10.0 * (1 - MARGIN) - 0.01, True), (10.0 * (1 - MARGIN) + 0.01, False),
                                        (10.0, False)])
def test_a_near_tie_goes_to_cublas(ours, wins):
    """Ours must win by MARGIN: a tie or a hair's gain keeps cuBLAS, so timing noise does not flip the kernels."""
    layer = nn.Linear(8, 24, bias=False)
    choice = GemmChoice("auto", [layer.weight], timer=FakeTimer({("cublas", 24): 10.0, ("skinny", 24): ours}))
    assert choice.skinny_wins(layer.weight, 3) is wins


def test_modes_and_the_cpu_path(tmp_path):
    """On the CPU (and wherever the kernel does not apply) every mode runs the layer itself and times nothing;
    an unknown mode is a one-line error at the model's construction too."""
    layer = nn.Linear(8, 24)
    x = torch.randn(2, 8)
    for mode in ("cublas", "skinny", "auto"):
        timer = FakeTimer({})
        out = GemmChoice(mode, [layer.weight], timer=timer).linear(layer, x)
        assert torch.equal(out, layer(x)) and timer.calls == []
    with pytest.raises(ValueError, match="gemm must be one of cublas, skinny, auto, not 'fast'"):
        GemmChoice("fast", [])
    with pytest.raises(ModelLoadError, match="gemm must be one of cublas, skinny, auto, not 'fast'"):
        build_model(tiny(tmp_path)[0], gemm="fast")


def test_the_model_gathers_every_layers_projections(tmp_path):
    """A fused model's choice sees all four projections of every layer (so `auto` times a shape over all of them);
    cuBLAS needs none."""
    args, sd = tiny(tmp_path)
    for gemm, made in (("cublas", False), ("auto", True)):
        model, _, _ = fill_model(build_model(args, fused=True, gemm=gemm), sd.items(), "cpu", torch.float32, "tiny")
        choice = model._gemm_choice()
        assert (choice is not None) == made
        if made:
            n = sum(len(ws) for ws in choice.weights.values())
            assert n == 4 * args.n_layers
            assert choice is model._gemm_choice()  # made once
