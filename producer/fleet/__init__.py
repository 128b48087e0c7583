"""Many outboxes, one relay process (docs/fleet.md): the fleet file and its discoveries, one relay per outbox
under supervision, leaderships spread over the fleet's processes, and the one endpoint labelled by outbox.

* :mod:`.spec` — the fleet file (``outboxes:`` / ``discover:`` / ``fleet:`` over the ``harvest:`` defaults);
* :mod:`.discovery` — finding outboxes (schemas by glob, databases by glob), and one outbox by id;
* :mod:`.member` — one outbox's relay on a thread of its own, started again after a failure;
* :mod:`.supervisor` — :class:`~.supervisor.Fleet`: decide, then apply, what runs; the shared sessions;
* :mod:`.balance` — each process's share of the leaderships;
* :mod:`.endpoint` — ``/metrics``, ``/healthz``, ``/readyz`` for every outbox;
* :mod:`.run` — the ``harvest -f fleet.yaml`` process and its SIGHUP reload.
"""
