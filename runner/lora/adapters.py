"""The runner's LoRA state: adapter slots on the device and each step's
token mask.

Persistent, built once (``RunnerConfig.lora``), like the request slots:

- one ``LoRAStack`` per target projection of every decoder layer (qkv,
  o, gate/up, down), ``max_loras`` adapter slots each, rank padded to
  ``max_lora_rank``; attached to the model's layers, which add their delta
  (``LlamaAttention.use_lora``, ``LlamaMLP.use_lora``);
- ``adapter_of_slot``: per request slot, 1 + the adapter slot it runs
  with, 0 for none (a staged tensor: zero-filled, so the padding slot and
  every fresh slot run without one); written when a request is added;
- ``token_mask`` [max tokens, max_loras]: per token of the step, 1 in its
  adapter's column, and ``token_slot`` [max tokens]: the same as one slot
  index (-1 for none), which the Triton delta reads (``runner.lora.stack``).
  Built on the device from ``idx_mapping`` and ``query_start_loc`` by
  ``prepare_tokens`` with the other inputs, inside the captured graphs, so
  no per-step upload is added.

``load`` reads an adapter the plan names (``SchedulerOutput.lora_loads``)
from its file, this rank's shard only, into an adapter slot; the engine
reloads a slot only when no running request uses it, and every step is
queued in plan order, so no step in flight reads a slot being written.
"""

from __future__ import annotations

import torch
from safetensors import safe_open

from ipc.config import LoRAConfig
from ipc.lora_adapter import LoRAAdapter, read_adapter
from ipc.model_config import ModelConfig
from runner.layers.linear import ColumnParallelLinear, RowParallelLinear
from runner.lora.stack import LoRAStack
from runner.staged_write import StagedWriteTensor

# Target module -> (the layer's projection that holds it, its part there).
_PROJECTIONS = {"q_proj": ("qkv", "q"), "k_proj": ("qkv", "k"), "v_proj": ("qkv", "v"),
                "o_proj": ("o", None), "gate_proj": ("gate_up", "gate"),
                "up_proj": ("gate_up", "up"), "down_proj": ("down", None)}


class LoRAAdapters:
    def __init__(self, config: LoRAConfig, model_config: ModelConfig, model, max_num_reqs: int,
                 max_num_tokens: int, device: torch.device) -> None:
        self.config, self.model_config = config, model_config
        self.dtype = next(model.parameters()).dtype
        n, r = config.max_loras, config.max_lora_rank
        self.token_mask = torch.zeros(max_num_tokens, n, dtype=self.dtype, device=device)
        self.token_slot = torch.full((max_num_tokens,), -1, dtype=torch.int32, device=device)
        self._slot_ids = torch.arange(1, n + 1, dtype=torch.int32, device=device)
        self._token_index = torch.arange(max_num_tokens, dtype=torch.int32, device=device)
        self.adapter_of_slot = StagedWriteTensor((max_num_reqs + 1,), torch.int32, device)
        self.layers: list[dict[str, tuple[torch.nn.Module, LoRAStack]]] = []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            linears = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj,
                       "down": mlp.down_proj}
            stacks = {name: (linear, self._stack(linear, n, r, device))
                      for name, linear in linears.items()}
            attn.use_lora(stacks["qkv"][1], stacks["o"][1])
            mlp.use_lora(stacks["gate_up"][1], stacks["down"][1])
            self.layers.append(stacks)

    def _stack(self, linear, num_slots: int, rank: int, device: torch.device) -> LoRAStack:
        out_features, in_features = linear.weight.shape
        part_ends = (out_features,)
        if isinstance(linear, ColumnParallelLinear):
            part_ends = tuple(linear.offsets[name] + part.size
                              for name, part in linear.parts.items())
        return LoRAStack(num_slots, part_ends, rank, in_features, self.token_mask,
                         self.token_slot, self.dtype, device)

    @property
    def staged_tensors(self) -> tuple[StagedWriteTensor, ...]:
        return (self.adapter_of_slot,)

    def add_request(self, slot: int, lora_slot: int) -> None:
        """Stage request slot ``slot``'s adapter slot (-1: none)."""
        self.adapter_of_slot.stage_write_elem(slot, lora_slot + 1)

    def prepare_tokens(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                       num_reqs: int, num_tokens: int) -> None:
        """``token_mask[:num_tokens]`` and ``token_slot[:num_tokens]`` for
        batch rows ``[0, num_reqs)``: token t belongs to the row r with
        qsl[r] <= t < qsl[r + 1]; tokens past the rows' (padding) take the
        last row's, and nothing reads their output."""
        ends = query_start_loc[1 : num_reqs + 1]
        rows = torch.searchsorted(ends, self._token_index[:num_tokens], right=True)
        rows = rows.clamp_(max=num_reqs - 1)
        adapter = self.adapter_of_slot.gpu[idx_mapping[rows].long()]
        self.token_mask[:num_tokens] = adapter[:, None] == self._slot_ids
        self.token_slot[:num_tokens] = adapter - 1

    @torch.no_grad()
    def load(self, slot: int, path: str) -> None:
        """Adapter slot ``slot`` <- the adapter at ``path``, this rank's shard."""
        adapter = read_adapter(path, self.model_config, self.config.max_lora_rank)
        for stacks in self.layers:
            for _, stack in stacks.values():
                stack.clear(slot)
        with safe_open(adapter.weights_path, framework="pt", device="cpu") as f:
            for tensor in adapter.tensors:
                if tensor.factor == "A":
                    b_name = tensor.name.replace("lora_A.", "lora_B.")
                    self._place(adapter, slot, tensor.layer, tensor.module,
                                f.get_tensor(tensor.name), f.get_tensor(b_name))

    def _place(self, adapter: LoRAAdapter, slot: int, layer: int, module: str,
               a: torch.Tensor, b: torch.Tensor) -> None:
        """One module's factors into its stack: A whole or by input columns,
        B (times the scale) by output rows or whole, as the base weight is
        sharded (``runner.lora.stack``)."""
        projection, part = _PROJECTIONS[module]
        linear, stack = self.layers[layer][projection]
        r = adapter.rank
        b = (b.float() * adapter.scale).to(self.dtype)
        a = a.to(self.dtype)
        if isinstance(linear, RowParallelLinear):
            cols = stack.columns(slot, 0)
            width = linear.weight.shape[1]
            stack.a[cols][:r].copy_(a[:, linear.in_start : linear.in_start + width])
            stack.b[:, cols][:, :r].copy_(b)
            return
        p = list(linear.parts).index(part)
        held, offset = linear.parts[part], linear.offsets[part]
        cols = stack.columns(slot, p)
        stack.a[cols][:r].copy_(a)
        stack.b[offset : offset + held.size, cols][:, :r].copy_(
            b[held.src_start : held.src_start + held.size])
