"""Where a run's prompts come from: vLLM's ``--dataset-name``, each with
its own options (``options``), in two steps so that a bad dataset stops
the run before anything starts.

``read_dataset`` checks the dataset's options and reads its file
(``sharegpt`` and ``custom`` take ``--dataset-path``; the datasets that
make their prompts refuse one, as vLLM's do), before the server is asked
anything; ``dataset_requests`` makes the requests once the tokenizer is
loaded. ``--input-len`` sets the random dataset's input length and
``--output-len`` every dataset's output length, as in vLLM.
"""

from __future__ import annotations

from launch.bench_serve.custom_dataset import custom_requests, read_custom
from launch.bench_serve.prefix_repetition_dataset import (
    check_prefix_repetition,
    prefix_repetition_requests,
)
from launch.bench_serve.random_dataset import SampleRequest, random_requests
from launch.bench_serve.sharegpt_dataset import read_sharegpt, sharegpt_requests

DATASETS = ("random", "sharegpt", "custom", "prefix_repetition")
_READERS = {"sharegpt": read_sharegpt, "custom": read_custom}


def read_dataset(args) -> list:
    """The entries of ``--dataset-path`` (the sharegpt dataset's (prompt,
    answer) pairs, the custom dataset's prompts; none for the others);
    ValueError naming the option for a missing or malformed file or a bad
    option of the dataset."""
    name, path = args.dataset_name, args.dataset_path
    if name in _READERS:
        if path is None:
            raise ValueError(f"--dataset-name {name} reads its prompts from a file: give "
                             "--dataset-path FILE")
        own = args.sharegpt_output_len if name == "sharegpt" else args.custom_output_len
        if (given := _output_len(args, own)) is not None and given < 1:
            raise ValueError(f"the output length (--{name}-output-len, --output-len) must be "
                             f"at least 1, got {given}")
        return _READERS[name](path)
    if path is not None:
        raise ValueError(f"--dataset-name {name} makes its own prompts: --dataset-path is for "
                         f"{' and '.join(_READERS)} (got {path})")
    if name == "prefix_repetition":
        check_prefix_repetition(args.num_prompts, args.prefix_repetition_prefix_len,
                                args.prefix_repetition_suffix_len,
                                args.prefix_repetition_num_prefixes, _output_len(
                                    args, args.prefix_repetition_output_len))
    return []


def _output_len(args, own: int | None) -> int | None:
    return args.output_len if args.output_len is not None else own


def dataset_requests(args, entries: list, tokenizer) -> list[SampleRequest]:
    """The requests of ``args``' dataset (``entries``: ``read_dataset``'s)."""
    shuffle, prefix = not args.disable_shuffle, args.request_id_prefix
    if args.dataset_name == "sharegpt":
        return sharegpt_requests(entries, tokenizer, args.num_prompts,
                                 _output_len(args, args.sharegpt_output_len), seed=args.seed,
                                 shuffle=shuffle, oversample=not args.no_oversample,
                                 request_id_prefix=prefix)
    if args.dataset_name == "custom":
        return custom_requests(entries, tokenizer, args.num_prompts,
                               _output_len(args, args.custom_output_len),
                               skip_chat_template=args.skip_chat_template, shuffle=shuffle,
                               oversample=not args.no_oversample, request_id_prefix=prefix,
                               chat_template_kwargs=args.chat_template_kwargs)
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_requests(
            tokenizer, args.num_prompts, args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
            _output_len(args, args.prefix_repetition_output_len), seed=args.seed,
            shuffle=shuffle, request_id_prefix=prefix)
    return random_requests(tokenizer, args.num_prompts,
                           args.input_len if args.input_len is not None
                           else args.random_input_len,
                           _output_len(args, args.random_output_len),
                           range_ratio=args.random_range_ratio,
                           prefix_len=args.random_prefix_len, seed=args.seed,
                           request_id_prefix=prefix)
