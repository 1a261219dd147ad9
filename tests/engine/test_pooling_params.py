"""``resolved_params`` refuses a ``truncate_prompt_tokens`` other than
None, -1 or k >= 1, as ``SamplingParams`` does: 0 would keep the whole
prompt (``[-0:]``) and a negative k below -1 would silently drop the
prompt's first tokens."""

import pytest

from engine.pooling_params import Matryoshka, PoolingParams, resolved_params
from engine.sampling_params import truncated_prompt
from ipc.errors import InvalidRequestError


def _resolved(**fields) -> PoolingParams:
    return resolved_params(PoolingParams.from_dict(fields), None, None, Matryoshka(), "m")


@pytest.mark.parametrize("k", [0, -2, -5])
def test_truncate_prompt_tokens_below_one_other_than_minus_one_is_refused(k):
    with pytest.raises(InvalidRequestError, match="truncate_prompt_tokens") as refused:
        _resolved(truncate_prompt_tokens=k)
    assert refused.value.param == "truncate_prompt_tokens"


@pytest.mark.parametrize("k, kept", [(None, [1, 2, 3, 4]), (-1, [1, 2, 3, 4]), (2, [3, 4])])
def test_truncate_prompt_tokens_taken(k, kept):
    params = _resolved(truncate_prompt_tokens=k)
    assert truncated_prompt([1, 2, 3, 4], params.truncate_prompt_tokens, 8) == kept
    assert params.normalize is True
