"""Which ``x @ weight.T`` the decode-size Triton matmuls can take.

The skinny kernels (at most 16 rows) and the medium ones (17..64 rows) feed
``tl.dot`` half precision tiles and read rows with unit stride; each family
owns a range of rows. One predicate serves both, so their conditions cannot
drift apart; whether a fitting shape then takes the kernel (enough programs,
a tuned config) is each family's own question.
"""

from __future__ import annotations

import torch

DOT_DTYPES = (torch.bfloat16, torch.float16)  # the tensor-core inputs these kernels are built for


def dot_inputs(x: torch.Tensor, weight: torch.Tensor, min_rows: int, max_rows: int) -> bool:
    """Whether ``x`` is half precision with ``min_rows``..``max_rows`` rows
    and ``x`` and ``weight`` have unit last strides."""
    return (x.dtype in DOT_DTYPES and min_rows <= x.shape[0] <= max_rows
            and x.stride(-1) == 1 and weight.stride(-1) == 1)
