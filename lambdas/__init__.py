"""Thin handlers for the ingest and downsampling microservices (AWS event in, engine call out),
and the local runner that polls the queues and calls them where no Lambda runs."""
