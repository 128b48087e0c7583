"""The outbox layouts (``outboxLayout``): goharvest's mark/purge (:mod:`.mark`) and the cursor (:mod:`.cursor`)."""
