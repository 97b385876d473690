"""NDBlaze, the Redis + Spark write buffer for bursts of small writes.

Not built yet: it arrives with the NDBlaze issue. Until then `/v1/blaze/` does not exist.
"""
