"""The ids answer is built without a Python object per id, and is the JSON it always was."""

import json

import numpy as np
import pytest

from ndstore.api.views.boss import ids_json


@pytest.mark.parametrize("ids", [np.array([], np.uint64), np.array([1, 7], np.uint64),
                                 np.arange(1, 300_001, dtype=np.uint64),
                                 np.array([np.iinfo(np.uint64).max], np.uint64)])
def test_ids_json_is_the_boss_shape(ids: np.ndarray) -> None:
    assert json.loads(ids_json(ids, batch=1000)) == {"ids": [str(i) for i in ids.tolist()]}
