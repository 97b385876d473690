"""The metadata database on PostgreSQL, every call bounded in time (base.py)."""
