"""The decoder norms carried by the matmuls (runner/layers/norm_in_matmul.py):
the torch references against the unfused norm, the fold at load, and the
model's forward that carries them against Hugging Face and against the
same checkpoint unfolded (the norms' own launches). The Triton epilogues
are checked against these references in test_norm_in_matmul_kernels.py."""

import pytest
import torch
import torch.nn.functional as F

from checkpoint.description import from_hf_dict
from runner.distributed import TensorParallelGroup
from runner.layers.norm_in_matmul import (
    fold_norm_weight,
    normed_linear_ref,
    row_parallel_matmul_add_ref,
    row_sum_of_squares,
)
from runner.layers.rms_norm import rms_norm_ref
from runner.loader import load_weights
from runner.models import build_model_from_config
from tests.helpers.checkpoints import build_model_from_dir, describe
from tests.helpers.model_parity import BLOCK_SIZES, check_close, run_scenario, save_hf_model
from tests.runner.test_loader import HF_CONFIG

EPS = 1e-5


def test_folded_projection_of_the_raw_rows_is_the_projection_of_the_normed_rows():
    """W (g * norm(x)) against rstd(x) * ((W diag g) x), float64 reference."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=gen) * 3
    g = 1 + 0.1 * torch.randn(48, generator=gen)
    w = torch.randn(20, 48, generator=gen)
    want = F.linear(rms_norm_ref(x.double(), g.double(), EPS), w.double())
    w_folded, g_after = w.clone(), g.clone()
    fold_norm_weight(w_folded, g_after)
    assert torch.equal(g_after, torch.ones(48))
    got = normed_linear_ref(x, w_folded, row_sum_of_squares(x), EPS)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # The parts of a row may be split anywhere: only their sum counts.
    parts = torch.stack([(x[:, :7] ** 2).sum(-1), (x[:, 7:] ** 2).sum(-1)], dim=-1)
    torch.testing.assert_close(normed_linear_ref(x, w_folded, parts, EPS), got)


def test_matmul_add_writes_the_residual_in_place_and_returns_its_squares():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, generator=gen).half()
    w = torch.randn(24, 16, generator=gen).half()
    residual = torch.randn(3, 24, generator=gen).half()
    before, storage = residual.clone(), residual.data_ptr()
    parts = row_parallel_matmul_add_ref(x, w, residual)
    assert residual.data_ptr() == storage
    assert torch.equal(residual, F.linear(x, w) + before)  # the unfused pair's two roundings
    assert parts.shape == (3, 1) and parts.dtype == torch.float32
    torch.testing.assert_close(parts[:, 0], (residual.float() ** 2).sum(-1))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("norm_in_matmul")
    return str(root), save_hf_model("llama", str(root))


def test_the_folded_model_carries_its_norms_and_matches_hf(llama):
    """The built model folds (norm weights 1, qkv and gate/up scaled), carries
    the norms at every size on CPU, and its logits match HF's."""
    model_dir, reference = llama
    model = build_model_from_dir(model_dir, torch.float32, torch.device("cpu"),
                                 TensorParallelGroup())
    assert model.norms_folded and model.carries_norms(1) and model.carries_norms(300)
    assert torch.equal(model.layers[0].input_layernorm.weight,
                       torch.ones_like(model.layers[0].input_layernorm.weight))
    check_close(run_scenario(model, BLOCK_SIZES[0]), reference)
    with pytest.raises(RuntimeError, match="folded already"):
        model.fold_norm_weights()


def test_an_unfolded_model_runs_the_norms_on_their_own(llama):
    """Loaded without the fold (its norm weights are the checkpoint's), the
    model must not carry the norms, and matches HF through the norm launches;
    a forward that carried them would skip the weights."""
    model_dir, reference = llama
    config = describe(model_dir)
    model = build_model_from_config(config, torch.float32, torch.device("cpu"),
                                    TensorParallelGroup(), init="empty")
    load_weights(model, model_dir)
    assert not model.norms_folded and not model.carries_norms(1)
    check_close(run_scenario(model, BLOCK_SIZES[0]), reference)


def test_tensor_parallel_ranks_never_carry_the_norms():
    """o_proj and down return partial sums under TP: no rank adds them into the residual."""
    config = from_hf_dict(HF_CONFIG)
    shard = build_model_from_config(config, torch.float32, torch.device("cpu"),
                                    TensorParallelGroup(0, 2))
    assert shard.norms_folded and not shard.carries_norms(1)
    whole = build_model_from_config(config, torch.float32, torch.device("cpu"),
                                    TensorParallelGroup())
    with pytest.raises(ValueError, match="whole sum"):
        shard.layers[0].self_attn.o_proj.add_into(torch.zeros(1, 16), torch.zeros(1, 32))
    assert whole.carries_norms(1)
