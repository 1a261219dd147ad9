"""Shared test set-up.

Without CUDA, Triton kernels run under the interpreter: TRITON_INTERPRET must
be set before any kernel module is imported, so it is set here, first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
