"""Pure operations on annotation (label) arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def keep_ids(labels: npt.NDArray[Any], ids: Sequence[int]) -> npt.NDArray[Any]:
    """Zero every voxel whose label is not in ``ids``."""
    keep = np.isin(labels, np.asarray(ids, dtype=labels.dtype))
    return np.where(keep, labels, labels.dtype.type(0))
