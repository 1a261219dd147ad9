"""vLLM's ``cache_salt``: a prompt's salt keys its prefix-cache blocks, so
prompts of different salts (or a salt and none) never share a cached block
and prompts of one salt share as unsalted ones do. References: hand-worked
block counts (a 40-token prompt holds two full 16-token blocks before its
last token; a 9-token one, two full 4-token blocks), and the unsalted
greedy output, which a salt must not change."""

from __future__ import annotations

import pytest

from engine import LLM, BeamSearchParams, SamplingParams
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request
from ipc.errors import InvalidRequestError

PROMPT_IDS = list(range(3, 43))  # 40 tokens: 32 of them in full blocks of 16


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TPRUN_CACHE", str(tmp_path_factory.mktemp("cache")))
    with LLM(model="tiny", device="cpu", max_model_len=64, block_size=16) as llm:
        yield llm
    mp.undo()


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _computed_and_freed(manager: KVCacheManager, request: Request) -> None:
    """Run the whole prompt of ``request`` through ``manager`` and free it,
    which registers its full blocks."""
    assert manager.allocate_slots(request, request.num_tokens) is not None
    request.num_computed_tokens = request.num_tokens
    manager.free(request)


def test_kv_cache_manager_keys_blocks_by_salt():
    """Block size 4, a 9-token prompt: its two full blocks are cached under
    its salt. The same tokens under another salt or none hit nothing; under
    the same salt, both blocks (8 tokens)."""
    manager = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    tokens = list(range(100, 109))

    def request(name: str, salt: str | None) -> Request:
        return Request(name, tokens, SamplingParams(max_tokens=1), cache_salt=salt)

    _computed_and_freed(manager, request("a", "tenant-a"))
    assert manager.get_computed_blocks(request("b", "tenant-b"))[1] == 0
    assert manager.get_computed_blocks(request("none", None))[1] == 0
    assert manager.get_computed_blocks(request("a2", "tenant-a"))[1] == 8
    _computed_and_freed(manager, request("none", None))
    assert manager.get_computed_blocks(request("none2", None))[1] == 8
    assert manager.get_computed_blocks(request("b2", "tenant-b"))[1] == 0


@pytest.mark.timeout(300)
def test_salted_prompts_share_cached_blocks_only_with_their_salt(llm):
    """The same 40-token prompt, one request after another: a new salt (or
    none, after salted runs) finds nothing cached, a salt seen before finds
    its two full blocks (32 tokens). Text prompts carry salts too. Every
    greedy output is the unsalted one."""
    runs = [("a", 0), ("b", 0), ("a", 32), (None, 0), (None, 32), ("b", 32)]
    outputs = []
    for salt, _ in runs:
        prompt = {"prompt_token_ids": PROMPT_IDS} | ({"cache_salt": salt} if salt else {})
        [out] = llm.generate(prompt, _greedy())
        outputs.append(out)
    assert [o.num_cached_tokens for o in outputs] == [cached for _, cached in runs]
    assert all(o.outputs[0].token_ids == outputs[3].outputs[0].token_ids for o in outputs)

    text = "a prompt long enough to fill more than one block of the cache"
    cached = [llm.generate({"prompt": text, "cache_salt": salt}, _greedy())[0]
              for salt in ("t1", "t2", "t1")]
    assert [o.num_cached_tokens for o in cached] == [0, 0, 16 * ((len(cached[0].prompt_token_ids)
                                                                  - 1) // 16)]
    [plain] = llm.generate(text, _greedy())
    assert all(o.outputs[0].token_ids == plain.outputs[0].token_ids for o in cached)


@pytest.mark.parametrize("salt", ["", 7])
def test_a_salt_that_is_not_a_non_empty_string_is_refused(llm, salt):
    with pytest.raises(InvalidRequestError, match="cache_salt must be a non-empty string") as e:
        llm.generate({"prompt": "hi", "cache_salt": salt}, _greedy())
    assert e.value.param == "cache_salt"


@pytest.mark.timeout(300)
def test_beam_search_salts_every_beam_of_a_salted_prompt(llm, monkeypatch):
    """Each step's requests of a salted prompt carry its salt, those of an
    unsalted one none; the beams are the unsalted search's."""
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    [plain] = llm.beam_search({"prompt_token_ids": PROMPT_IDS}, params)
    made, new_request = [], llm.engine.new_request
    monkeypatch.setattr(llm.engine, "new_request", lambda *a, **k: made.append(
        (request := new_request(*a, **k)).cache_salt) or request)
    salted, other = llm.beam_search([{"prompt_token_ids": PROMPT_IDS, "cache_salt": "s"},
                                     {"prompt_token_ids": PROMPT_IDS[:20]}], params)
    assert sorted(set(made), key=str) == [None, "s"]
    assert made.count("s") == made.count(None) > 0
    assert [s.tokens for s in salted.sequences] == [s.tokens for s in plain.sequences]
