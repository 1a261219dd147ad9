"""The openai client of a test module's ``server`` fixture (tests/helpers/http_utils.py);
a module whose server asks for an API key defines its own."""

import pytest

from tests.helpers.http_utils import openai_client


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c
