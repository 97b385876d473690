"""Segmentation products of label channels, pure: meshes and skeletons of one supercuboid, the
stored fragment objects, and Neuroglancer's precomputed formats built from them
(docs/design/segmentation.md)."""
