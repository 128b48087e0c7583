"""The cursor layout: :class:`~producer.layouts.cursor.layout.CursorLayout`, its relay database
(:mod:`.database`), its table (:mod:`.schema`), partitions, views, held rows, the cursor's decisions
(:mod:`._watermark`) and the migration to it (:mod:`.migrate`)."""
