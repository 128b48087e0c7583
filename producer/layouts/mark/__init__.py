"""The mark layout (goharvest's): :class:`~producer.layouts.mark.layout.MarkLayout`, its relay database
(:mod:`.database`), the mark statement (:mod:`.marks`) and how many rows the next mark claims (:mod:`.marksize`)."""
