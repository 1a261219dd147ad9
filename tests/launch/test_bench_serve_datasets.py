"""``tprun bench serve``'s datasets besides random: sharegpt and custom
read from small local files, prefix_repetition made from numpy's draws.
Each expectation is worked by hand from the file (the tiny tokenizer
makes one token a byte, with a BOS before every text) or drawn the way
vLLM draws it (its global ``random.seed`` / ``np.random.seed`` calls,
in its order); a missing or malformed file is one ``tprun: error:``
line before anything starts."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as HfTokenizer

from checkpoint.tiny_model import ensure_tiny_model
from checkpoint.tokenizer import Tokenizer
from launch.bench_serve.custom_dataset import custom_requests, read_custom
from launch.bench_serve.prefix_repetition_dataset import prefix_repetition_requests
from launch.bench_serve.random_dataset import random_requests
from launch.bench_serve.sharegpt_dataset import read_sharegpt, sharegpt_requests
from launch.cli import main


def _conversation(*turns: str) -> dict:
    return {"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": text}
                              for i, text in enumerate(turns)]}


# Prompt and answer lengths with the tiny tokenizer: bytes + 1 (the BOS).
SHAREGPT = [
    _conversation("hello there", "general kenobi"),        # 12, 15: kept
    _conversation("hi", "a long enough answer"),            # prompt 3 < 4: dropped
    _conversation("only one turn"),                          # one turn: not read
    {"id": "no conversations"},                              # not read
    _conversation("what is two plus two", "4"),             # answer 2 < 4: dropped
    _conversation("x" * 1100, "fine answer"),                # prompt 1101 > 1024: dropped
    _conversation("y" * 1000, "z" * 1100),                   # 1001 + 1101 > 2048: dropped
    _conversation("tell me a joke", "no", "third turn"),     # answer 3 < 4: dropped
]


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return Tokenizer.from_dir(ensure_tiny_model())


@pytest.fixture
def sharegpt_file(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    return str(path)


def _fields(requests) -> list[tuple]:
    return [(r.prompt, r.prompt_len, r.expected_output_len, r.request_id) for r in requests]


def test_sharegpt_keeps_vllms_lengths_and_oversamples_what_it_kept(sharegpt_file, tiny):
    pairs = read_sharegpt(sharegpt_file)
    assert [p for p, _ in pairs] == ["hello there", "hi", "what is two plus two", "x" * 1100,
                                     "y" * 1000, "tell me a joke"]
    requests = sharegpt_requests(pairs, tiny, 3, shuffle=False, request_id_prefix="p")
    # One kept; vLLM draws the other two from it.
    assert _fields(requests) == [("hello there", 12, 15, "p0"), ("hello there", 12, 15, "p1"),
                                 ("hello there", 12, 15, "p2")]
    alone = sharegpt_requests(pairs, tiny, 3, shuffle=False, oversample=False)
    assert _fields(alone) == [("hello there", 12, 15, "0")]


def test_sharegpt_output_len_replaces_the_answers_and_its_minimum(sharegpt_file, tiny):
    pairs = read_sharegpt(sharegpt_file)
    requests = sharegpt_requests(pairs, tiny, 3, output_len=7, shuffle=False)
    assert _fields(requests) == [("hello there", 12, 7, "0"), ("what is two plus two", 21, 7, "1"),
                                 ("y" * 1000, 1001, 7, "2")]


def test_sharegpt_order_is_vllms_seeded_shuffle(sharegpt_file, tiny):
    pairs = read_sharegpt(sharegpt_file)
    order = list(pairs)
    random.seed(3)  # vLLM: random.seed(seed); random.shuffle(data)
    random.shuffle(order)
    kept_with_len_7 = {"hello there", "what is two plus two", "y" * 1000, "tell me a joke"}
    expected = [p for p, _ in order if p in kept_with_len_7]
    requests = sharegpt_requests(pairs, tiny, 4, output_len=7, seed=3)
    assert [r.prompt for r in requests] == expected
    assert [r.prompt for r in requests] != [p for p, _ in pairs if p in kept_with_len_7]


def test_sharegpt_oversampling_is_vllms_draws(tmp_path, tiny):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([_conversation(f"prompt {i}", f"answer {i}") for i in range(3)]))
    requests = sharegpt_requests(read_sharegpt(str(path)), tiny, 7, seed=2)
    order = [f"prompt {i}" for i in range(3)]
    random.seed(2)
    random.shuffle(order)
    random.seed(2)  # vLLM reseeds, then draws each extra request with random.choice
    extra = [random.choice(order) for _ in range(4)]
    assert [r.prompt for r in requests] == order + extra
    assert [r.request_id for r in requests] == [str(i) for i in range(7)]
    assert {r.prompt_len for r in requests} == {9} and {r.expected_output_len for r in requests} == {9}


@pytest.fixture
def custom_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "alpha"}\n\n{"prompt": "beta", "category": 1}\n'
                    '{"prompt": "gamma"}\n')
    return str(path)


def test_custom_prompts_rendered_with_the_chat_template(custom_file, tiny):
    prompts = read_custom(custom_file)
    assert prompts == ["alpha", "beta", "gamma"]
    requests = custom_requests(prompts, tiny, 1, shuffle=False)
    # "<s>" and "</s>" one token each, the rest a token a byte, and the BOS encode adds.
    text = "<s><|user|>\nalpha</s>\n<|assistant|>\n"
    assert _fields(requests) == [(text, 1 + 1 + 9 + 5 + 1 + 1 + 14, 256, "0")]
    plain = custom_requests(prompts, tiny, 2, output_len=5, skip_chat_template=True,
                            shuffle=False, request_id_prefix="c-")
    assert _fields(plain) == [("alpha", 6, 5, "c-0"), ("beta", 5, 5, "c-1")]


def test_custom_order_is_vllms_seed_0_shuffle_and_oversampling(custom_file, tiny):
    order = ["alpha", "beta", "gamma"]
    random.seed(0)  # vLLM's custom dataset is never given --seed: its default, 0
    random.shuffle(order)
    random.seed(0)
    extra = [random.choice(order) for _ in range(2)]
    requests = custom_requests(read_custom(custom_file), tiny, 5, skip_chat_template=True)
    assert [r.prompt for r in requests] == order + extra
    assert [r.request_id for r in requests] == ["0", "1", "2", "3", "4"]


@pytest.fixture
def words(tmp_path) -> Tokenizer:
    """A word-level tokenizer whose every token decodes and encodes back
    to itself, so that each prompt is the words of numpy's draws."""
    vocab = {f"w{i}": i for i in range(20)}
    hf = HfTokenizer(models.WordLevel(vocab, unk_token="w0"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens([AddedToken("<eos>", special=True)])  # id 20, added: never drawn
    hf.save(str(tmp_path / "tokenizer.json"))
    return Tokenizer.from_dir(str(tmp_path))


def _vllm_prefix_repetition_prompts(seed, num_prompts, prefix_len, suffix_len, num_prefixes):
    """vLLM's draws in vLLM's order: np.random.seed(seed), then randint for
    a prefix, then for each of its suffixes, prefix after prefix."""
    np.random.seed(seed)
    prompts = []
    for _ in range(num_prefixes):
        prefix = np.random.randint(0, 20, size=prefix_len).tolist()
        for _ in range(num_prompts // num_prefixes):
            suffix = np.random.randint(0, 20, size=suffix_len).tolist()
            prompts.append(" ".join(f"w{i}" for i in prefix + suffix))
    return prompts


def test_prefix_repetition_prompts_are_vllms_draws(words):
    expected = _vllm_prefix_repetition_prompts(11, 7, 2, 3, 3)
    requests = prefix_repetition_requests(words, 7, prefix_len=2, suffix_len=3, num_prefixes=3,
                                          output_len=9, seed=11, shuffle=False,
                                          request_id_prefix="r")
    assert _fields(requests) == [(p, 5, 9, f"r{i}") for i, p in enumerate(expected)]
    # Three prefixes (7 // 3 = 2 prompts each: 6 requests, as vLLM makes).
    assert [p.split()[:2] for p in expected[::2]] == [p.split()[:2] for p in expected[1::2]]
    shuffled = prefix_repetition_requests(words, 7, prefix_len=2, suffix_len=3, num_prefixes=3,
                                          output_len=9, seed=11)
    random.seed(11)
    random.shuffle(expected)
    assert [r.prompt for r in shuffled] == expected


def test_random_prompts_are_vllms_draws_over_the_vocabulary_without_added_tokens(words):
    """vLLM's random dataset: lengths, then offsets below Hugging Face's
    vocab_size (20 here: the added <eos> left out), then the shared prefix,
    all from one default_rng(seed); request i's own tokens run from its
    offset + i."""
    assert words.vocab_size == 21
    requests = random_requests(words, 4, input_len=5, output_len=3, range_ratio=0.4,
                               prefix_len=2, seed=7)
    rng = np.random.default_rng(7)
    input_lens = rng.integers(3, 7 + 1, size=4)  # [floor(5 * 0.6), ceil(5 * 1.4)]
    output_lens = rng.integers(1, 5 + 1, size=4)
    offsets = rng.integers(0, 20, size=4)
    prefix = rng.integers(0, 20, size=2).tolist()
    expected = [" ".join(f"w{t}" for t in prefix + [(offsets[i] + i + k) % 20
                                                    for k in range(input_lens[i])])
                for i in range(4)]
    assert [r.prompt for r in requests] == expected
    assert [r.prompt_len for r in requests] == list(input_lens + 2)
    assert [r.expected_output_len for r in requests] == list(output_lens)


def test_prefix_repetition_lengths_count_the_texts_ids_and_prefixes_are_shared(tiny):
    """With the byte tokenizer random ids are often no UTF-8 (a replacement
    character, three bytes, in their text): vLLM's rounds then end with
    other lengths than asked, and each length is its prompt's own ids."""
    requests = prefix_repetition_requests(tiny, 4, prefix_len=6, suffix_len=5, num_prefixes=2,
                                          seed=1, shuffle=False)
    ids = [tiny.encode(r.prompt, add_special_tokens=False) for r in requests]
    assert [r.prompt_len for r in requests] == [len(i) for i in ids]
    assert [r.prompt_len for r in requests] != [11] * 4
    assert ids[0][:6] == ids[1][:6] and ids[2][:6] == ids[3][:6] and ids[0][:6] != ids[2][:6]


def _bench(tmp_path, capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "tiny",
                 *[a.format(dir=tmp_path) for a in argv]])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv, message", [
    (("--dataset-name", "sharegpt", "--dataset-path", "{dir}/missing.json"),
     "--dataset-path {dir}/missing.json: No such file or directory"),
    (("--dataset-name", "sharegpt", "--dataset-path", "{dir}/broken.json"),
     "--dataset-path {dir}/broken.json is not a ShareGPT JSON file: "),
    (("--dataset-name", "sharegpt", "--dataset-path", "{dir}/object.json"),
     "--dataset-path {dir}/object.json is not a ShareGPT JSON file: it holds a dict"),
    (("--dataset-name", "sharegpt", "--dataset-path", "{dir}/turns.json"),
     '--dataset-path {dir}/turns.json: entry 1: its first two turns need a text "value"'),
    (("--dataset-name", "sharegpt",), "--dataset-name sharegpt reads its prompts from a file"),
    (("--dataset-name", "custom", "--dataset-path", "{dir}/bad.jsonl"),
     "--dataset-path {dir}/bad.jsonl: line 2 is not JSON: "),
    (("--dataset-name", "custom", "--dataset-path", "{dir}/noprompt.jsonl"),
     '--dataset-path {dir}/noprompt.jsonl: line 1 is not an object with a text "prompt"'),
    (("--dataset-name", "custom", "--dataset-path", "{dir}/broken.json"),
     "--dataset-name custom reads a JSONL file, its name ending with .jsonl"),
    (("--dataset-path", "{dir}/broken.json"), "--dataset-name random makes its own prompts"),
    (("--dataset-name", "prefix_repetition", "--num-prompts", "3"),
     "--num-prompts (3) must be at least --prefix-repetition-num-prefixes (10)"),
])
def test_a_bad_dataset_is_one_error_line_before_anything_starts(tmp_path, capsys, argv,
                                                                 message):
    (tmp_path / "broken.json").write_text('[{"conversations": ')
    (tmp_path / "object.json").write_text('{"conversations": []}')
    (tmp_path / "turns.json").write_text(json.dumps([_conversation("a", "b"),
                                                     {"conversations": ["a", "b"]}]))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    (tmp_path / "noprompt.jsonl").write_text('{"text": "a"}\n')
    code, out, err = _bench(tmp_path, capsys, *argv)
    assert code == 2
    assert out == ""  # not even the model line: nothing started
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tprun: error: {message.format(dir=tmp_path)}")
