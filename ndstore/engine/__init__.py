"""Tiered read/write of volumes: direct I/O, and (later) the cache tier, flusher and managers."""
