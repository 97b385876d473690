"""Neuroglancer's precomputed annotation format, pure numpy: the layout of one annotation's bytes
(layout.py) and the multi-level spatial index (spatial.py). docs/design/annotations.md."""
