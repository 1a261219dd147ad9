"""AsyncOutput: a step's sampled tokens, on their way to the host.

On CUDA the copy runs on a side stream that first waits for the main
stream, copies into pinned memory and records an event. ``get_output()``
waits on that event: the only wait on the device in the whole step.
"""

from __future__ import annotations

import numpy as np
import torch

from ipc.messages import ModelRunnerOutput


class AsyncOutput:
    def __init__(
        self,
        step_id: int,
        req_ids: list[str],
        sample_mask: np.ndarray,
        sampled_token_ids: torch.Tensor,
        copy_stream: torch.cuda.Stream | None,
    ):
        self.step_id = step_id
        self.req_ids = req_ids
        self.sample_mask = sample_mask
        self.copy_event: torch.cuda.Event | None = None
        if copy_stream is None:
            self.host_tokens = sampled_token_ids.clone()
            return
        main_stream = torch.cuda.current_stream()
        self.host_tokens = torch.empty(
            sampled_token_ids.shape, dtype=sampled_token_ids.dtype, pin_memory=True
        )
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(main_stream)
            self.host_tokens.copy_(sampled_token_ids, non_blocking=True)
            sampled_token_ids.record_stream(copy_stream)
            self.copy_event = torch.cuda.Event(blocking=True)
            self.copy_event.record(copy_stream)

    def get_output(self) -> ModelRunnerOutput:
        """Wait for the copy, then build the reply (empty lists for rows
        whose prefill chunk did not reach the end of the prefill)."""
        if self.copy_event is not None:
            self.copy_event.synchronize()
        tokens = self.host_tokens.tolist()
        sampled = [[t] if keep else [] for t, keep in zip(tokens, self.sample_mask)]
        return ModelRunnerOutput(
            step_id=self.step_id, req_ids=self.req_ids, sampled_token_ids=sampled
        )
