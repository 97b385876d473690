"""The Python client (`Volume`) and the `ndstore` command line."""

from ndstore.client.volume import Volume, VolumeError

__all__ = ["Volume", "VolumeError"]
