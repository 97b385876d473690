"""Segmentation products of label channels kept with their voxels: where fragments are stored,
which are stale, their rebuild on the queue machinery, and segment properties
(docs/design/segmentation.md)."""
