class Skipped(Exception):
    """A supercuboid too costly to build a product of; the message says why."""
