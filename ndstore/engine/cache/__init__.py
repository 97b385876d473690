"""The cache tier, cut by its callers (docs/design/cache-tier.md).

- tier.py: `CacheTier`, the owner of the cache, the locks and the base tier: the request path
  (read, write, purge) and coherence with the base tier (read_base, read_raw, write_base,
  exclusive, rewriting, write_back).
- ports.py: the narrow interfaces each caller gets of it (RequestPath, Coherence,
  WriteBackDaemon, EvictionDaemon, Operations, LossAdmin, BufferRecord).
- parts.py: cuboid blobs and the codec work between them and a box (no I/O).
- copies.py: copies of base-tier objects in the cache: page-ins (after the answer too) and restores.
- lock_free.py: small reads and writes without locks, where the cache offers lock-free commits.
- writeback.py: write-back and eviction under the supercuboids' locks (`CacheTier.upkeep`).
- loss.py: the checked mark, the ledger, lost supercuboids, the record of NDBlaze writes (`CacheTier.loss`).
- daemons.py: the flusher and the cache manager.
"""
