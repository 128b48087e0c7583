"""Observability: metrics, histograms, health, the HTTP endpoints, tracing, shard status."""
