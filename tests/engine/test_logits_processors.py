"""Custom logits processors (vLLM's API, ``runner.sampling.logits_processor``):
named by class or qualified name, imported by every worker, told of each
step's added and removed requests, applied before the draw; per-request
arguments in ``SamplingParams.extra_args``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import ConfigError
from ipc.errors import InvalidRequestError
from ipc.messages import NewRequestData, SamplingOptions
from runner.sampler import Sampler
from runner.sampling.custom_processors import CustomLogitsProcessors
from runner.sampling.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from tests.helpers.devices import DEVICES
from tests.helpers.hf_models import save_spread, small_llama
from tests.helpers.sampler_writes import write_added_requests

NAME = "tests.engine.test_logits_processors:ForceToken"


class ForceToken(LogitsProcessor):
    """Leaves one token to draw for the requests whose ``extra_args`` name
    it (``force_token``); tracks every request it is told of, and fails a
    step where an update names an index it does not hold."""

    def __init__(self, config, device, is_pin_memory):
        self.held: set[int] = set()
        self.targets: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            assert index in self.held, f"removed {index}, which holds no request"
            self.held.discard(index)
            self.targets.pop(index, None)
        for index, params, _, _ in batch_update.added:
            self.held.add(index)
            target = (params.extra_args or {}).get("force_token")
            if target is None:
                self.targets.pop(index, None)
            else:
                self.targets[index] = target
        for a, b, how in batch_update.moved:
            ta, tb = self.targets.pop(a, None), self.targets.pop(b, None)
            if ta is not None:
                self.targets[b] = ta
            if how == MoveDirectionality.SWAP and tb is not None:
                self.targets[a] = tb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.targets:
            return logits
        rows = torch.tensor(list(self.targets), device=logits.device)
        cols = torch.tensor(list(self.targets.values()), device=logits.device)
        kept = logits[rows, cols]
        logits[rows] = float("-inf")
        logits[rows, cols] = kept
        return logits


class NotAProcessor:
    pass


PROMPTS = [[5, 17, 99, 3], [44, 120, 7], [8, 9, 10, 11, 12], [200, 3, 4], [1, 2, 3], [77, 6]]


def _params():
    """Forced requests (even indices) and plain ones, of different lengths so
    that requests finish and others take their slots."""
    out = []
    for i in range(len(PROMPTS)):
        extra = {"force_token": 30 + i} if i % 2 == 0 else None
        out.append(SamplingParams(temperature=0.0, max_tokens=3 + 2 * i, ignore_eos=True,
                                  extra_args=extra))
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = small_llama(2, 256, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=128)
    return save_spread(model, tmp_path_factory.mktemp("llama_logits_processors")), model


def hf_greedy(model, prompt, steps) -> list[int]:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def _check(outs, model):
    for i, (out, params) in enumerate(zip(outs, _params())):
        got = out.outputs[0].token_ids
        if i % 2 == 0:
            assert got == [30 + i] * params.max_tokens
        else:
            assert got == hf_greedy(model, PROMPTS[i], params.max_tokens)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("given", [ForceToken, NAME, "tests.engine.test_logits_processors.ForceToken"])
def test_forced_tokens_one_rank(llama, given, device):
    # On CUDA: the table on the device, decode steps from CUDA graphs (none
    # with the argmax inside: a processor may change it), the Triton draw.
    path, model = llama
    with LLM(model=path, device=device, max_num_seqs=2, logits_processors=[given]) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _params())
    _check(outs, model)


@pytest.mark.timeout(300)
def test_forced_tokens_two_ranks(llama):
    path, model = llama
    with LLM(model=path, device="cpu", tensor_parallel_size=2, max_num_seqs=2,
             logits_processors=[NAME]) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _params())
    _check(outs, model)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", DEVICES)
def test_sampled_requests_without_arguments_are_unchanged(llama, device):
    """Seeded draws at a temperature, beside forced requests, are the draws
    of a run without the processor (on the same device)."""
    path, _ = llama
    params = [SamplingParams(temperature=0.8, seed=11 + i, max_tokens=6, ignore_eos=True,
                             extra_args={"force_token": 40} if i == 1 else {"other": [1]})
              for i in range(3)]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:3]]
    with LLM(model=path, device=device, logits_processors=[ForceToken]) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    with LLM(model=path, device=device) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got[1] == [40] * 6
    assert got[0] == plain[0] and got[2] == plain[2]
    assert plain[1] != got[1]


class FailsToConstruct(LogitsProcessor):
    def __init__(self, config, device, is_pin_memory):
        raise RuntimeError("no table for this model")

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        pass

    def apply(self, logits):
        return logits


@pytest.mark.parametrize("given, says", [
    (["no_such_module_here:Proc"], "cannot import module 'no_such_module_here'"),
    (["tests.engine.test_logits_processors:Missing"], "has no 'Missing'"),
    (["tests.engine.test_logits_processors:NotAProcessor"], "is not a subclass"),
    ([NotAProcessor], "is not a subclass"),
    (["ForceToken"], "give 'module:Class' or 'module.Class'"),
    ("tests.engine.test_logits_processors:ForceToken", "must be a list"),
])
def test_bad_names_refused_before_workers(given, says):
    from engine.config import EngineConfig

    with pytest.raises(ConfigError, match=says):
        EngineConfig(model="tiny", device="cpu", logits_processors=given)


def test_class_that_workers_cannot_import_refused():
    from engine.config import EngineConfig

    class Local(ForceToken):
        pass

    with pytest.raises(ConfigError, match="not in __main__ or a function"):
        EngineConfig(model="tiny", device="cpu", logits_processors=[Local])


def test_refused_with_speculative_decoding():
    from engine.config import EngineConfig

    spec = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ConfigError, match="not supported with speculative decoding"):
        EngineConfig(model="tiny", device="cpu", logits_processors=[NAME],
                     speculative_config=spec)


def test_names_reach_the_runner_config():
    from engine.config import EngineConfig

    config = EngineConfig(model="tiny", device="cpu", logits_processors=[ForceToken])
    assert config.logits_processors == [NAME]


@pytest.mark.timeout(120)
def test_failing_constructor_named_at_start(llama):
    path, _ = llama
    with pytest.raises(Exception, match="FailsToConstruct' failed to construct: "
                                        "RuntimeError: no table for this model"):
        LLM(model=path, device="cpu",
            logits_processors=["tests.engine.test_logits_processors:FailsToConstruct"])


def _deep(n: int) -> dict:
    """An object with lists nested ``n`` deep inside it."""
    value: list = [1]
    for _ in range(n - 1):
        value = [value]
    return {"a": value}


@pytest.mark.parametrize("extra", [
    {1: "int key"}, {"a": object()}, {"a": float("nan")}, {"a": (1, 2)}, ["not", "a", "dict"],
    {"a": 1 << 70}, _deep(33),
])
def test_bad_extra_args_refused(extra):
    with pytest.raises(InvalidRequestError, match="extra_args must be None or a JSON object"):
        SamplingParams(extra_args=extra)


def test_json_extra_args_taken():
    extra = {"a": None, "b": [1, 2.5, "x", True], "c": {"d": {"e": -3}}}
    assert SamplingParams(extra_args=extra).to_options().extra_args == extra
    # The object and 31 lists inside it: 32 deep.
    assert SamplingParams(extra_args=_deep(31)).to_options().extra_args == _deep(31)


def _new(req_id: str, extra: dict | None) -> NewRequestData:
    return NewRequestData(req_id=req_id, prompt_token_ids=[1, 2], prefill_token_ids=[1, 2, 9],
                          sampling=SamplingOptions(extra_args=extra), block_ids=[[0]],
                          num_computed_tokens=0, max_tokens=4)


class Recorder(ForceToken):
    def __init__(self, config, device, is_pin_memory):
        super().__init__(config, device, is_pin_memory)
        self.updates: list[BatchUpdate | None] = []

    def update_state(self, batch_update):
        self.updates.append(batch_update)
        super().update_state(batch_update)


def test_batch_updates_by_slot():
    """Each step's update names slots: additions with their parameters, prompt
    and earlier outputs; a slot freed and taken again in one step is an
    addition only (it replaces the old request); no step moves a request;
    a step without changes passes None."""
    rec = Recorder(None, torch.device("cpu"), False)
    custom = CustomLogitsProcessors([rec], max_num_reqs=4, vocab_size=50,
                                    device=torch.device("cpu"))
    custom.add_request(3, _new("a", {"force_token": 7}))
    custom.add_request(2, _new("b", None))
    custom.update_state()
    custom.update_state()
    custom.remove_request(3)
    custom.remove_request(2)
    custom.add_request(2, _new("c", {"force_token": 5}))
    custom.update_state()
    first, none, third = rec.updates
    assert none is None
    assert first.batch_size == 4 and first.removed == [] and first.moved == []
    assert [(i, p.extra_args, prompt, out) for i, p, prompt, out in first.added] == [
        (3, {"force_token": 7}, [1, 2], [9]), (2, None, [1, 2], [9])]
    assert third.removed == [3] and [i for i, *_ in third.added] == [2]
    assert rec.targets == {2: 5}
    # Rows in batch order, at slots [2, 0]: row 0 is slot 2's and keeps token 5 alone.
    logits = torch.randn(2, 50)
    out = custom.apply_changing(logits, torch.tensor([2, 0]))
    assert torch.isinf(out[0]).sum() == 49 and out[0, 5] == logits[0, 5]
    assert torch.equal(out[1], logits[1])


def test_cli_names_processors():
    from launch.cli import _engine_config, build_parser

    args = build_parser().parse_args(["serve", "--model", "tiny", "--device", "cpu",
                                      "--logits-processors", NAME,
                                      "tests.engine.test_logits_processors.Recorder"])
    assert _engine_config(args).logits_processors == [
        NAME, "tests.engine.test_logits_processors.Recorder"]
    args = build_parser().parse_args(["generate", "--model", "tiny", "--device", "cpu",
                                      "--logits-processors", "no_such_module_here.Proc"])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_here'"):
        _engine_config(args)


def test_http_vllm_xargs_become_extra_args():
    from serving.http.protocol import CompletionRequest
    from serving.http.sampling import choice_params

    request = CompletionRequest(model="m", prompt="hi", vllm_xargs={"force_token": 67})
    (params,) = choice_params(request, max_tokens=4, logprobs=None)
    assert params["extra_args"] == {"force_token": 67}
    request = CompletionRequest(model="m", prompt="hi", vllm_xargs={"x": float("inf")})
    with pytest.raises(InvalidRequestError, match="extra_args must be None or a JSON object"):
        choice_params(request, max_tokens=4, logprobs=None)


_ELSEWHERE = '''
from runner.sampling.logits_processor import LogitsProcessor


class ForceElsewhere(LogitsProcessor):
    """Every request draws ``force_token`` alone."""

    def __init__(self, config, device, is_pin_memory):
        self.targets = {}

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.targets.pop(index, None)
        for index, params, _, _ in batch_update.added:
            self.targets[index] = (params.extra_args or {}).get("force_token")

    def apply(self, logits):
        for index, target in self.targets.items():
            if target is not None:
                kept = logits[index, target].clone()
                logits[index] = float("-inf")
                logits[index, target] = kept
        return logits
'''


@pytest.mark.timeout(300)
def test_processor_beside_the_callers_script_reaches_worker_daemons(llama, tmp_path,
                                                                    monkeypatch):
    """A processor in a folder only the caller's import path holds (a module
    beside the caller's script) is imported by worker daemons too, which
    start without the caller's folder on their path."""
    path, _ = llama
    (tmp_path / "procs_beside_script.py").write_text(_ELSEWHERE)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                            extra_args={"force_token": 61})
    with LLM(model=path, device="cpu", executor="mp",
             logits_processors=["procs_beside_script:ForceElsewhere"]) as llm:
        (out,) = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)
    assert out.outputs[0].token_ids == [61, 61, 61]


class StopOrFallback(LogitsProcessor):
    """Leaves one token to draw for the requests whose ``extra_args`` name a
    ``stop`` and a ``fallback``: the stop token where its logit is finite,
    else the fallback. It reads what ran before it: where min-tokens has
    masked the stop token, it picks the fallback."""

    def __init__(self, config, device, is_pin_memory):
        self.rules: dict[int, tuple[int, int]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rules.pop(index, None)
        for index, params, _, _ in batch_update.added:
            extra = params.extra_args or {}
            if "stop" in extra:
                self.rules[index] = (extra["stop"], extra["fallback"])
            else:
                self.rules.pop(index, None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (stop, fallback) in self.rules.items():
            keep = stop if torch.isfinite(logits[index, stop]) else fallback
            kept = logits[index, keep].clone()
            logits[index] = float("-inf")
            logits[index, keep] = kept
        return logits


@pytest.mark.timeout(300)
def test_min_tokens_masks_before_processors_that_change_the_argmax(llama):
    """vLLM runs its min-tokens processor before custom ones: for the first
    ``min_tokens`` tokens the processor sees the stop token at -inf and
    picks the fallback; then it picks the stop token, which ends the
    request. (Masked after the processor, every token of those rows would
    be -inf.)"""
    path, _ = llama
    stop, fallback = 7, 30
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3,
                            stop_token_ids=[stop],
                            extra_args={"stop": stop, "fallback": fallback})
    with LLM(model=path, device="cpu",
             logits_processors=["tests.engine.test_logits_processors:StopOrFallback"]) as llm:
        (out,) = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)
    assert out.outputs[0].token_ids == [fallback, fallback, fallback, stop]
    assert out.outputs[0].finish_reason == "stop"


class RowMaxima(LogitsProcessor):
    """Argmax-invariant: records, each call, the largest finite logit and
    the number of finite logits of every row it is given, and changes
    nothing."""

    def __init__(self, config, device, is_pin_memory):
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        finite = torch.isfinite(logits)
        self.seen.append((logits.amax(dim=-1).clone(), finite.sum(dim=-1)))
        return logits


def test_argmax_invariant_processors_see_temperature_scaled_logits_after_min_p():
    """vLLM divides by the temperature, then runs min-p and the
    argmax-invariant processors, then top-k: slot 1 (temperature 0.5,
    min_p 0.5, top_k 1) shows the processor its row halved, with the two
    tokens within log(2) of the maximum after scaling and no top-k cut yet;
    slot 3 (temperature 2) its row halved, every token kept; greedy slot 0
    its row as it is (divided by 1), and its token is the argmax."""
    vocab = 8
    rec = RowMaxima(None, torch.device("cpu"), False)
    custom = CustomLogitsProcessors([rec], max_num_reqs=4, vocab_size=vocab,
                                    device=torch.device("cpu"))
    sampler = Sampler(4, vocab, torch.device("cpu"), seed=0, custom=custom)
    sampler.add_request(1, SamplingOptions(temperature=0.5, min_p=0.5, top_k=1, seed=3), 2, 2)
    sampler.add_request(3, SamplingOptions(temperature=2.0, seed=4), 2, 2)
    sampler.add_request(0, SamplingOptions(temperature=0.0), 2, 2)
    write_added_requests(sampler, torch.zeros(4, 16, dtype=torch.int32))
    # Row 0 (slot 1): scaled [6, 5.8, 4, ...]: 5.8 >= 6 + log(0.5) = 5.31 is
    # kept by min-p, 4 is not. Row 1 (slot 3): scaled max 1.5.
    logits = torch.tensor([[3.0, 2.9, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0],
                           [-1.0, 3.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0],
                           [0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0]])
    idx_np = np.array([1, 3, 0], dtype=np.int32)
    out = sampler(logits, torch.from_numpy(idx_np), idx_np, torch.tensor([2, 2, 2]),
                  torch.ones(3, dtype=torch.bool))
    ((maxima, finite),) = rec.seen  # rows by slot: 1, 3, 0
    assert maxima[[1, 3, 0]].tolist() == [6.0, 1.5, 4.0]
    assert finite[[1, 3, 0]].tolist() == [2, vocab, vocab]
    # top_k 1 after the processor: slot 1 draws its argmax; slot 0 is greedy.
    assert out.sampled_token_ids[[0, 2]].tolist() == [0, 5]


@pytest.mark.parametrize("device", DEVICES)
def test_argmax_invariant_path_draws_alike_through_the_triton_kernels(device):
    """The draw after argmax-invariant processors (filters and Gumbel draw
    at temperature 1) through the Triton kernels (compiled on CUDA, under
    the interpreter on CPU) draws what the torch references draw on the same
    device, over a batch of greedy, filtered and plain rows."""
    from runner.ops import torch_ops, triton_ops

    device = torch.device(device)
    logits = (torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 3).to(device)
    idx = np.array([1, 0, 2], dtype=np.int32)
    draws = []
    for ops in (torch_ops(device), triton_ops(device)):
        custom = CustomLogitsProcessors([RowMaxima(None, device, False)], 4, 64, device)
        sampler = Sampler(4, 64, device, 0, custom)
        sampler.ops = ops
        sampler.add_request(1, SamplingOptions(temperature=0.7, top_p=0.9, top_k=20,
                                               min_p=0.05, seed=3), 2, 2)
        sampler.add_request(0, SamplingOptions(temperature=0.0), 2, 2)
        sampler.add_request(2, SamplingOptions(temperature=1.3, seed=9), 2, 2)
        write_added_requests(sampler, torch.zeros(4, 16, dtype=torch.int32, device=device))
        draws.append([sampler(logits, torch.from_numpy(idx).to(device), idx,
                              torch.full((3,), pos, device=device),
                              torch.ones(3, dtype=torch.bool, device=device))
                      .sampled_token_ids.tolist() for pos in range(12)])
        # The processor ran at every draw: the path under test.
        assert len(custom.invariant[0].seen) == 12
    assert draws[0] == draws[1]
    assert {row[1] for row in draws[0]} == {int(logits[1].argmax())}
