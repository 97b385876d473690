"""NDStore: a tiered storage service for petascale 3-D/4-D image volumes."""

__version__ = "0.1.0"
