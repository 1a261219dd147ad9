"""Where the kernel tests run Triton: compiled on the GPU when CUDA is there,
else on the CPU under the interpreter (conftest sets TRITON_INTERPRET)."""

import torch

KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
