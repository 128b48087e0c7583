"""The cursor layout: partitions, views, held rows, the watermark and the migration to it."""
