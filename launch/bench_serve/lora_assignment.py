"""Which LoRA adapter each request of a serving benchmark names (vLLM's
``--lora-modules`` and ``--lora-assignment``): the request's ``model``
field is the adapter's name, as a server started with ``--lora-modules
NAME=PATH`` serves it.

``round-robin`` gives request ``i`` the name ``i mod len(names)``;
``random`` draws each request's name uniformly, in request order, from
Python's ``random.Random(seed)``: a seed gives the same names run after
run (vLLM draws from its process-wide ``random`` after the dataset's
own draws, so its names for a seed differ). The ready check and the
warm-up requests name the base model, as vLLM's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

ASSIGNMENTS = ("random", "round-robin")


def lora_names(names: Sequence[str], num_requests: int, assignment: str,
               seed: int) -> list[str]:
    """The adapter name of each request, in order."""
    if not names:
        raise ValueError("--lora-modules needs at least one adapter name")
    if assignment == "round-robin":
        return [names[i % len(names)] for i in range(num_requests)]
    if assignment != "random":
        raise ValueError(f"--lora-assignment must be one of {', '.join(ASSIGNMENTS)}, got "
                         f"{assignment!r}")
    draws = random.Random(seed)
    return [draws.choice(list(names)) for _ in range(num_requests)]
