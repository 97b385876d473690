"""Thin handlers for the ingest and downsampling microservices (AWS event in, engine call out).

Not built yet: they arrive with the ingest and scaling-levels issues.
"""
