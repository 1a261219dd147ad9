"""Where the kernel tests run Triton: compiled on the GPU when CUDA is there,
else on the CPU under the interpreter (conftest sets TRITON_INTERPRET)."""

import torch

KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def kernel_dtypes(*dtypes: torch.dtype) -> list[torch.dtype]:
    """``dtypes``, and bfloat16 where the kernels are compiled: the
    interpreter neither runs ``tl.dot`` on bfloat16 nor rounds bfloat16 as
    the device does."""
    return list(dtypes) + ([torch.bfloat16] if KERNEL_DEVICE.type == "cuda" else [])
