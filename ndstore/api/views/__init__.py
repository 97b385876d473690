"""Thin views: parse at the edge, one engine call, a response."""
