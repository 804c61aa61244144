"""The GPU tests' parameter grid (tests/conftest.py `grid`), checked where it is collected: on any machine."""

import pytest
import torch
from conftest import grid

F16, F32 = torch.float16, torch.float32


def test_grid_ids_name_every_value_and_quick_marks_only_the_listed_combinations():
    params = grid([F16, F32], [64], [(1, (1, 4095)), (16, (0, 1000))], quick=[(F32, 64, 16, (0, 1000))])
    assert [p.values for p in params][1] == (F16, 64, 16, (0, 1000))
    # a failing case names its dtype, and `-k bf16` selects by it (pytest alone numbers them: dtype0, dtype1...)
    assert [p.id for p in params] == ["fp16-64-1-1_4095", "fp16-64-16-0_1000", "fp32-64-1-1_4095", "fp32-64-16-0_1000"]
    assert [bool(p.marks) for p in params] == [False, False, False, True]


def test_a_quick_combination_outside_the_grid_is_an_error_not_a_silently_smaller_quick_set():
    with pytest.raises(ValueError, match="not in the grid"):
        grid([F16, F32], [64, 128], quick=[(F32, 80)])
