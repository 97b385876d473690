"""What a supercuboid may cost to build a product of, measured before the costly call."""

from __future__ import annotations


class Skipped(Exception):
    """A supercuboid too costly to build a product of; the message says why."""
