"""Tiered read/write of volumes: the base tier, the cache tier (which owns the base tier and
keeps every path coherent with its cache), direct I/O, the write-back flusher and cache manager,
the ingest pipeline's phases and the resolution hierarchy's builds. Storage only through the
ports of ndstore.storage.interfaces."""
