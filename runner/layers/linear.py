"""Tensor-parallel linear layers (Megatron style).

ColumnParallelLinear holds a block of output rows per rank and leaves its
output sharded; RowParallelLinear holds a block of input columns and sums
the partial products over the ranks. A column layer feeding a row layer
therefore needs one all_reduce in total.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runner.distributed import TensorParallelGroup
from runner.layers.weight_slice import WeightSlice
from runner.ops import device_ops


@dataclass(frozen=True)
class OutputPart:
    """Rows ``src_start .. src_start + size`` of checkpoint tensor ``name`` (``full_size``
    rows in all) held here."""

    name: str
    src_start: int
    size: int
    full_size: int


def _even_split(total: int, tp: TensorParallelGroup, what: str) -> tuple[int, int]:
    """(start, size) of this rank's share of ``total``; ValueError if uneven."""
    if total % tp.size:
        raise ValueError(f"{what} ({total}) is not divisible by tensor-parallel size {tp.size}")
    size = total // tp.size
    return tp.rank * size, size


class ColumnParallelLinear(nn.Module):
    """y_local = x @ W_local.T (+ b_local): this rank's rows of one or more fused outputs.

    ``parts`` list, in order, the blocks of rows this rank holds; the output
    is their concatenation and is not gathered.
    """

    def __init__(self, in_features: int, parts: list[OutputPart], bias: bool,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.parts = {p.name: p for p in parts}
        self.offsets: dict[str, int] = {}
        offset = 0
        for p in parts:
            self.offsets[p.name] = offset
            offset += p.size
        self.output_size = offset
        self.weight = nn.Parameter(torch.empty(offset, in_features, dtype=dtype),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(offset, dtype=dtype), requires_grad=False)
                     if bias else None)
        # The LoRA factors whose delta forward adds (``runner.lora``); None
        # without LoRA serving, and then forward is the plain matmul.
        self.lora = None

    @classmethod
    def split_evenly(cls, in_features: int, outputs: dict[str, int], tp: TensorParallelGroup,
                     bias: bool, dtype: torch.dtype) -> ColumnParallelLinear:
        """Each named output of full size n contributes rows rank*n/tp .. (rank+1)*n/tp."""
        parts = []
        for name, total in outputs.items():
            start, size = _even_split(total, tp, f"output {name!r}")
            parts.append(OutputPart(name, start, size, total))
        return cls(in_features, parts, bias, dtype)

    @classmethod
    def qkv(cls, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
            tp: TensorParallelGroup, bias: bool, dtype: torch.dtype) -> ColumnParallelLinear:
        """Fused q, k, v projections, split by heads.

        Query heads split evenly. With at least tp kv heads, kv heads split
        evenly too; with fewer, each rank holds one replicated kv head,
        r * num_kv_heads // tp, which is the one its query heads use.
        """
        q_start, q_heads = _even_split(num_heads, tp, "num_attention_heads")
        kv_start, kv_heads = kv_head_range(num_kv_heads, tp)
        parts = [OutputPart("q", q_start * head_dim, q_heads * head_dim, num_heads * head_dim)]
        for name in ("k", "v"):
            parts.append(OutputPart(name, kv_start * head_dim, kv_heads * head_dim,
                                    num_kv_heads * head_dim))
        return cls(hidden_size, parts, bias, dtype)

    def weight_slices(self, part: str) -> tuple[WeightSlice, WeightSlice | None]:
        """(weight, bias) slices filled by checkpoint tensor ``part``."""
        p = self.parts[part]
        dst = self.offsets[part]
        weight = WeightSlice(self.weight, 0, p.src_start, p.size, p.full_size, dst)
        bias = (None if self.bias is None
                else WeightSlice(self.bias, 0, p.src_start, p.size, p.full_size, dst))
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if self.lora is None else self.lora.add_delta(x, y)


def kv_head_range(num_kv_heads: int, tp: TensorParallelGroup) -> tuple[int, int]:
    """(first kv head, number of kv heads) held by this rank."""
    if num_kv_heads >= tp.size:
        return _even_split(num_kv_heads, tp, "num_key_value_heads")
    if tp.size % num_kv_heads:
        raise ValueError(
            f"tensor-parallel size {tp.size} must be a multiple of num_key_value_heads "
            f"({num_kv_heads}) when it exceeds it"
        )
    return tp.rank * num_kv_heads // tp.size, 1


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_local @ W_local.T, then + b (bias added once, after the sum).

    The input is the sharded output of a column-parallel layer; the output is
    complete and identical on every rank.
    """

    def __init__(self, in_features: int, out_features: int, tp: TensorParallelGroup,
                 bias: bool, dtype: torch.dtype, reduce_output: bool = True) -> None:
        super().__init__()
        self.tp = tp
        # False: forward returns this rank's partial sum (bias added on rank 0
        # only) and the next layer reduces it (the decoder's fused norm).
        self.reduce_output = reduce_output
        self.in_features = in_features
        self.in_start, in_local = _even_split(in_features, tp, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, in_local, dtype=dtype),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
                     if bias else None)
        self.ops = device_ops(self.weight.device)
        # As ColumnParallelLinear's: the LoRA delta of this rank's input
        # columns, a partial sum reduced with the base output.
        self.lora = None

    def weight_slices(self) -> tuple[WeightSlice, WeightSlice | None]:
        """(weight, bias): the weight by input columns, the bias whole."""
        weight = WeightSlice(self.weight, 1, self.in_start, self.weight.shape[1], self.in_features)
        bias = None if self.bias is None else WeightSlice.whole(self.bias)
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Decode batches on CUDA (at most 16 rows, wide outputs) take the
        one-pass skinny kernel: cuBLAS splits K for these shapes and reduces in
        a second launch (see triton_skinny_matmul.uses_skinny_matmul)."""
        local = self.ops.row_parallel_matmul(x, self.weight)
        if self.lora is not None:
            local = self.lora.add_delta(x, local)
        if not self.reduce_output:
            return local if self.bias is None or self.tp.rank else local + self.bias
        y = self.tp.all_reduce(local)
        return y if self.bias is None else y + self.bias

    def add_into(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual += x @ W.T in place, one launch for decode batches on CUDA;
        returns the new residual's parts (its rows' sums of squares, the norm
        carried by the matmuls: ``norm_in_matmul.py``). One rank, no bias:
        the sum must be whole where it is added."""
        if self.tp.size > 1 or self.bias is not None or self.lora is not None:
            raise ValueError("add_into needs the whole sum: one rank, no bias and no LoRA")
        return self.ops.row_parallel_matmul_add(x, self.weight, residual)
