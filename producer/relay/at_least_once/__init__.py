"""The at-least-once mode: goharvest's per-record purge."""
