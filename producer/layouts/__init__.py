"""The outbox layouts (``outboxLayout``; docs/design.md §10), each a strategy chosen once: the protocol
(:mod:`.layout`: :class:`~producer.layouts.layout.OutboxLayout` and the
:class:`~producer.layouts.layout.RelayDatabase` it opens), the chooser (:mod:`.choice`: ``layout_for``, the
only place that tells the layouts apart), goharvest's mark layout (:mod:`.mark`) and the cursor layout
(:mod:`.cursor`).

This package imports none of them (producer/db/ imports :mod:`.mark.marks`, which the layouts build on)."""
