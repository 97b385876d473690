"""Moved: the cache tier is ndstore/engine/cache/ (tier.py holds `CacheTier`). This name stays
only while branches written against it are merged; new code imports ndstore.engine.cache.tier."""

from __future__ import annotations

from ndstore.engine.cache.ports import Rewrite
from ndstore.engine.cache.tier import CacheTier

__all__ = ["CacheTier", "Rewrite"]
