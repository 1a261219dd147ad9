"""LLM.classify on a sequence classifier: the probabilities equal HF
transformers' ``LlamaForSequenceClassification`` logits of the same
checkpoint, through softmax (sigmoid for one label) by hand."""

import functools

import numpy as np
import pytest
import torch
import transformers  # the oracle: a test dependency, never skipped

from engine import LLM
from engine.pooling_params import PoolingParams
from ipc.errors import InvalidRequestError
from tests.helpers.hf_models import POOLING_CHUNK, POOLING_PROMPTS, save_classifier


@functools.cache
def _hf_logits(path: str) -> list[np.ndarray]:
    """HF's logits of each prompt, one prompt a batch (its last token)."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].double().numpy() for p in POOLING_PROMPTS]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("cls3"), num_labels=3)


@pytest.fixture(scope="module")
def one_label(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("cls1"), num_labels=1)


def _classify(path, tp=1, params=None, **kwargs):
    with LLM(model=path, tensor_parallel_size=tp, device="cpu", block_size=16,
             max_num_seqs=8, max_num_batched_tokens=POOLING_CHUNK, **kwargs) as llm:
        outs = llm.classify([{"prompt_token_ids": p} for p in POOLING_PROMPTS],
                            pooling_params=params)
    assert [o.prompt_token_ids for o in outs] == POOLING_PROMPTS
    return [np.array(o.outputs.probs) for o in outs], outs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tp", [1, 2])
def test_probabilities_match_transformers(three_labels, tp):
    # The architecture alone makes a pooling classifier (runner "auto").
    got, outs = _classify(three_labels, tp=tp)
    for probs, out, logits in zip(got, outs, _hf_logits(three_labels), strict=True):
        assert out.outputs.num_classes == 3
        np.testing.assert_allclose(probs, _softmax(logits), atol=2e-5)
        assert probs.sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.timeout(180)
def test_one_label_is_a_sigmoid_and_activation_can_be_off(one_label):
    got, _ = _classify(one_label, runner="pooling")
    raw, _ = _classify(one_label, params=PoolingParams(use_activation=False))
    for probs, logits_out, logits in zip(got, raw, _hf_logits(one_label), strict=True):
        np.testing.assert_allclose(probs, 1 / (1 + np.exp(-logits)), atol=2e-5)
        np.testing.assert_allclose(logits_out, logits, atol=2e-4)


@pytest.mark.timeout(180)
def test_pooler_config_turns_activation_off_and_embedding_parameters_are_refused(three_labels):
    raw, _ = _classify(three_labels, pooler_config={"use_activation": False})
    for logits_out, logits in zip(raw, _hf_logits(three_labels), strict=True):
        np.testing.assert_allclose(logits_out, logits, atol=2e-4)
    with LLM(model=three_labels, device="cpu", block_size=16, max_num_seqs=8) as llm:
        with pytest.raises(InvalidRequestError, match=r"Task classify only supports "
                           r"\['use_activation'\] parameters, does not support \['normalize'\]"):
            llm.classify("hello", pooling_params=PoolingParams(normalize=True))
        with pytest.raises(InvalidRequestError, match="pooling_task must be one of"):
            llm.embed("hello")
        with pytest.raises(InvalidRequestError, match="not supported by a pooling model"):
            llm.generate("hello")


def _hf_pair_logits(path: str, pairs: list[tuple[str, str]]) -> tuple[list[list[int]], list]:
    """transformers' pair encoding of each pair (the fast tokenizer of the
    checkpoint's tokenizer.json) and its one logit."""
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{path}/tokenizer.json")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32).eval()
    ids = [tokenizer(text=a, text_pair=b)["input_ids"] for a, b in pairs]
    with torch.no_grad():
        logits = [model(torch.tensor([i])).logits[0, 0].item() for i in ids]
    return ids, logits


def _hf_pair_scores(path: str, pairs: list[tuple[str, str]]) -> tuple[list[list[int]], list]:
    """``_hf_pair_logits`` with the sigmoid of each logit (a cross-encoder's
    default activation)."""
    ids, logits = _hf_pair_logits(path, pairs)
    return ids, [1 / (1 + np.exp(-x)) for x in logits]


@pytest.mark.timeout(180)
def test_one_label_classifier_scores_pairs_as_a_cross_encoder(one_label, three_labels):
    query, documents = "what is a cat", ["a cat is an animal", "the sky is blue today"]
    ids, want = _hf_pair_scores(one_label, [(query, d) for d in documents])
    with LLM(model=one_label, device="cpu", block_size=16, max_num_seqs=8) as llm:
        outs = llm.score(query, documents)
        pairwise = llm.score([query, documents[1]], documents)
        with pytest.raises(InvalidRequestError, match="scores texts only"):
            llm.score({"prompt_token_ids": [1, 2]}, documents)
    assert [o.prompt_token_ids for o in outs] == ids
    np.testing.assert_allclose([o.outputs.score for o in outs], want, atol=2e-5)
    _, want_pairwise = _hf_pair_scores(one_label, [(query, documents[0]),
                                                   (documents[1], documents[1])])
    np.testing.assert_allclose([o.outputs.score for o in pairwise], want_pairwise, atol=2e-5)
    with LLM(model=three_labels, device="cpu", block_size=16, max_num_seqs=8) as llm:
        with pytest.raises(InvalidRequestError, match=r"only enabled for num_labels == 1"):
            llm.score(query, documents)


@pytest.mark.timeout(180)
def test_multi_label_classifier_takes_each_labels_sigmoid(tmp_path):
    # config.json's problem_type "multi_label_classification": each label is
    # its own yes/no (transformers trains it with BCE), so each probability
    # is its logit's sigmoid, not a softmax over the labels.
    path = save_classifier(tmp_path, num_labels=3, problem_type="multi_label_classification")
    got, _ = _classify(path)
    for probs, logits in zip(got, _hf_logits(path), strict=True):
        np.testing.assert_allclose(probs, 1 / (1 + np.exp(-logits)), atol=2e-5)


@pytest.mark.timeout(180)
def test_regression_head_answers_its_values_for_classifications_and_scores(tmp_path):
    # problem_type "regression": each label is a value (transformers trains
    # it with MSE), so a classification answers the logits as they are, and
    # a cross-encoder's pair score is its one logit (vLLM's classifier
    # activation, which its scores take too).
    three = save_classifier(tmp_path / "three", num_labels=3, problem_type="regression")
    got, _ = _classify(three)
    for values, logits in zip(got, _hf_logits(three), strict=True):
        np.testing.assert_allclose(values, logits, atol=2e-4)
    one = save_classifier(tmp_path / "one", num_labels=1, problem_type="regression")
    query, documents = "what is a cat", ["a cat is an animal", "the sky is blue today"]
    _, want = _hf_pair_logits(one, [(query, d) for d in documents])
    with LLM(model=one, device="cpu", block_size=16, max_num_seqs=8) as llm:
        values = llm.classify([{"prompt_token_ids": p} for p in POOLING_PROMPTS])
        scores = llm.score(query, documents)
    for out, logits in zip(values, _hf_logits(one), strict=True):
        np.testing.assert_allclose(out.outputs.probs, logits, atol=2e-4)
    np.testing.assert_allclose([o.outputs.score for o in scores], want, atol=2e-4)


def _sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x)))


def _identity(x):
    return np.asarray(x)


ST_IDENTITY = "torch.nn.modules.linear.Identity"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fields, activation", [
    # sentence-transformers 4 and later write the activation here.
    ({"sentence_transformers": {"activation_fn": ST_IDENTITY, "version": "4.1.0"}}, _identity),
    # Older versions wrote this key; any torch.nn.modules class applies.
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}, np.tanh),
    # Where both are there, the newer key wins.
    ({"sentence_transformers": {"activation_fn": ST_IDENTITY},
      "sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"},
     _identity),
    # problem_type, where config.json gives one, wins over both.
    ({"problem_type": "multi_label_classification",
      "sbert_ce_default_activation_function": ST_IDENTITY}, _sigmoid),
    # A module is applied as at inference (eval mode, as vLLM's model runs
    # it): dropout passes the logits through, RReLU's negative slope is the
    # mean of its bounds (1/8 and 1/3).
    ({"sbert_ce_default_activation_function": "torch.nn.modules.dropout.Dropout"}, _identity),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.RReLU"},
     lambda x: np.where(np.asarray(x) < 0, np.asarray(x) * (1 / 8 + 1 / 3) / 2, x)),
])
def test_cross_encoder_takes_its_sentence_transformers_activation(tmp_path, fields, activation):
    path = save_classifier(tmp_path, num_labels=1, **fields)
    query, documents = "what is a cat", ["a cat is an animal", "the sky is blue today"]
    ids, logits = _hf_pair_logits(path, [(query, d) for d in documents])
    with LLM(model=path, device="cpu", block_size=16, max_num_seqs=8) as llm:
        scores = llm.score(query, documents)
        raw = llm.score(query, documents, pooling_params=PoolingParams(use_activation=False))
        classified = llm.classify([{"prompt_token_ids": i} for i in ids])
    assert [o.prompt_token_ids for o in scores] == ids
    np.testing.assert_allclose([o.outputs.score for o in scores], activation(logits), atol=2e-5)
    np.testing.assert_allclose([o.outputs.score for o in raw], logits, atol=2e-4)
    # A classification of the same prompt is the same activated logit.
    np.testing.assert_allclose([o.outputs.probs[0] for o in classified], activation(logits),
                               atol=2e-5)


@pytest.mark.parametrize("name, reason", [
    ("os.system", "only classes of torch.nn.modules are loaded"),
    ("torch.nn.modules.linear.Linear", "cannot be built"),
    ("torch.nn.modules.activation.NoSuchThing", "cannot be built"),
])
def test_cross_encoder_activation_outside_torch_modules_is_refused(tmp_path, name, reason):
    from engine.config import ConfigError

    path = save_classifier(tmp_path, num_labels=1, sbert_ce_default_activation_function=name)
    with pytest.raises(ConfigError, match=reason):
        LLM(model=path, device="cpu")


@pytest.mark.parametrize("name, reason", [
    ("torch.nn.modules.module.Module", "missing the required \"forward\""),
    ("torch.nn.modules.loss.MSELoss", "target"),
    ("torch.nn.modules.activation.GLU", "even"),  # halves the one label
])
def test_an_activation_that_cannot_take_the_logits_is_refused_at_start(tmp_path, name, reason):
    # A module that builds but fails on a [1, num_labels] logit row (no
    # forward, a second input, a shape it cannot take) stops the start with
    # one line, as vLLM's start-up pooler run fails on it, before any
    # request reaches it.
    from engine.config import ConfigError

    path = save_classifier(tmp_path, num_labels=1, sbert_ce_default_activation_function=name)
    with pytest.raises(ConfigError, match=f"cannot be applied to 1 logit.*{reason}"):
        LLM(model=path, device="cpu")


def test_an_activation_name_that_is_no_module_class_is_never_called(tmp_path, monkeypatch):
    # A callable that torch.nn.modules' namespaces hold but that is not a
    # torch module class is refused before anything calls it: a
    # checkpoint's text builds torch module classes only.
    from engine.config import ConfigError

    calls = []
    monkeypatch.setattr(torch.nn.modules.activation, "probe", lambda: calls.append(1),
                        raising=False)
    path = save_classifier(tmp_path, num_labels=1,
                           sbert_ce_default_activation_function="torch.nn.modules.activation.probe")
    with pytest.raises(ConfigError, match="is not a torch module"):
        LLM(model=path, device="cpu")
    assert calls == []


@pytest.mark.timeout(180)
def test_cross_encoder_truncates_a_pair_as_transformers_does(one_label):
    # truncate_prompt_tokens cuts a pair as the tokenizer's own pair
    # truncation does (longest text first, from its end), so the short
    # query stays whole while the long document loses its tail.
    query = "what is a cat"
    document = "a cat is a small animal that likes to sleep in the sun all day long"
    k = 30
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{one_label}/tokenizer.json")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        one_label, dtype=torch.float32).eval()
    ids = tokenizer(text=query, text_pair=document, truncation=True, max_length=k)["input_ids"]
    assert len(ids) == k and ids[:len(query)] == tokenizer(query)["input_ids"][:len(query)]
    with torch.no_grad():
        want = 1 / (1 + np.exp(-model(torch.tensor([ids])).logits[0, 0].item()))
    with LLM(model=one_label, device="cpu", block_size=16, max_num_seqs=8) as llm:
        (out,) = llm.score(query, document, truncate_prompt_tokens=k)
    assert out.prompt_token_ids == ids
    assert out.outputs.score == pytest.approx(want, abs=2e-5)


def test_pair_truncation_matches_transformers_for_every_length(one_label):
    from checkpoint.tokenizer import Tokenizer

    ours = Tokenizer.from_dir(one_label)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{one_label}/tokenizer.json")
    pairs = [("short q", "a much longer document text"), ("a much longer first text", "tiny"),
             ("same len", "same len")]
    for a, b in pairs:
        for k in range(3, len(a) + len(b) + 4):
            want = theirs(text=a, text_pair=b, truncation=True, max_length=k)["input_ids"]
            assert ours.encode_pair(a, b, k) == want, (a, b, k)


@pytest.mark.timeout(180)
def test_classifier_checkpoint_refuses_custom_logits_processors(three_labels):
    # The checkpoint alone makes a pooling model, which samples nothing (as
    # runner "pooling" refuses them).
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="Pooling models do not support custom logits"):
        LLM(model=three_labels, device="cpu",
            logits_processors=["tests.engine.test_logits_processors:ForceToken"])


@pytest.mark.parametrize("num_labels", [None, 1, 3])
def test_label_names_without_id2label_are_transformers_defaults(three_labels, num_labels):
    # A config.json that names no labels: transformers (and so vLLM's
    # /classify "label") calls them LABEL_<i>, num_labels of them (2 unset).
    import json

    from checkpoint.description import from_hf_dict

    with open(f"{three_labels}/config.json") as f:
        hf = json.load(f)
    hf.pop("id2label")
    hf.pop("label2id")
    if num_labels is not None:
        hf["num_labels"] = num_labels
    want = transformers.LlamaConfig.from_dict(hf).id2label
    assert from_hf_dict(hf).labels == tuple(want[i] for i in range(len(want)))
