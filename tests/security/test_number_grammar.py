"""Numbers in URLs and queries are ASCII digits, and nothing else: `str.isdigit()` and regex
`\\d` also pass digits of other scripts and superscripts, which int() reads as numbers ('٣' is 3)
or refuses ('¹', a 500 before: found by the OpenAPI fuzzer). Each such number is refused with the
answer a malformed one gets, and nothing is read or written."""

from __future__ import annotations

import numpy as np
import pytest
from rest_framework.test import APIClient

from tests.api.conftest import Dataset

NOT_ASCII = ["\u00b9", "\u0663", "\uff13"]  # superscript one, Arabic-Indic three, fullwidth three


@pytest.mark.parametrize("digit", NOT_ASCII)
def test_numbers_that_are_not_ascii_digits_are_refused_everywhere(admin: APIClient, dataset: Dataset,
                                                                   digit: str) -> None:
    stored = np.full((4, 30, 40), 7, np.uint8)
    url = dataset.cutout("img8", 0, (0, 40), (0, 30), (0, 4))
    assert admin.generic("POST", url, stored.tobytes(), content_type="application/octet-stream").status_code == 201
    refused = {
        f"/v1/cutout/c1/e1/img8/0/0:4{digit}/0:30/0:4/": 400,  # "malformed cutout URL"
        f"/v1/cutout/c1/e1/img8/{digit}/0:40/0:30/0:4/": 400,
        f"/precomputed/c1/e1/img8/{digit}/0-40_0-30_0-4": 404,  # no such scale key
        f"/precomputed/c1/e1/img8/0/0-4{digit}_0-30_0-4": 404,  # no such precomputed file
        f"/v1/image/c1/e1/img8/xy/0/0:40/0:30/0/?format=jpeg&quality=5{digit}": 400,
        f"/v1/audit/?limit={digit}": 400,
    }
    for path, status in refused.items():
        r = admin.get(path)
        assert r.status_code == status, (path, r.status_code, r.content[:200])
    r = admin.generic("POST", f"/v1/cutout/c1/e1/img8/0/0:4{digit}/0:30/0:4/", np.zeros(4800, np.uint8).tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 400 and "malformed cutout URL" in r.json()["message"]
    back = admin.get(url, HTTP_ACCEPT="application/octet-stream")
    np.testing.assert_array_equal(np.frombuffer(back.content, np.uint8).reshape(stored.shape), stored)
