"""NDBlaze, the Redis + Spark write buffer for bursts of small random writes.

blob (the stored header, applying a blob), buffer (the Redis adapter), tier (buffered writes,
consistent reads), merge (one supercuboid at a time), spark_job (the merge round on Spark),
daemon (when rounds run). See docs/design/blaze.md.
"""
