"""Fixtures the HTTP tests share: the openai client of a test module's
``server`` fixture (tests/helpers/http_utils.py; a module whose server
asks for an API key defines its own), and the model of a module's
in-process app (``recording_app``) with transformers' tokenizer of it."""

import pytest

from tests.helpers.http_utils import openai_client


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


@pytest.fixture(scope="module")
def model_dir(tiny_dir) -> str:
    """The model a module's in-process app serves: ``tiny``, unless the
    module defines its own ``model_dir``."""
    return tiny_dir


@pytest.fixture(scope="module")
def hf(model_dir):
    """transformers' tokenizer of ``model_dir``: the reference for the
    prompt the app renders and tokenizes."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
