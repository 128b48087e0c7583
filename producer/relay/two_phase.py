"""Two-phase-commit writers and the NOTIFY trigger (``wakeup``: issue #44, defect 3).

Postgres refuses ``PREPARE TRANSACTION`` in a transaction that has queued a NOTIFY ("cannot PREPARE a
transaction that has executed LISTEN, UNLISTEN, or NOTIFY"), and the outbox's statement-level trigger
NOTIFYs on every INSERT: with it, an XA / JTA writer (Narayana, Atomikos, Spring's JTA transaction
manager) that inserts an outbox row cannot prepare. The trigger cannot skip the NOTIFY for such a
transaction: whether a PREPARE follows is decided after the INSERT, by the transaction manager. So the
choice is the outbox's: ``wakeup: notify`` (the trigger; a row is relayed a few milliseconds after its
commit) or ``wakeup: poll`` (no trigger; the idle relay marks every ``limits.idlePollInterval``, at most
``limits.minPollInterval``: 100ms by default, so a row waits up to that long).

What is detectable: a server whose ``max_prepared_transactions`` is 0 (Postgres' default) refuses every
PREPARE TRANSACTION, so only a server that allows them can have such writers; rows in
``pg_prepared_xacts`` of the outbox's database show that some are in use. ``init-db`` and ``harvest
check`` say so when ``wakeup`` is left unset (setting it records the choice and silences them).
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg


class PreparedTransactions(NamedTuple):
    #: The server's ``max_prepared_transactions`` (0: PREPARE TRANSACTION is refused).
    allowed: int
    #: Transactions prepared in the current database and not yet committed or rolled back.
    prepared: int


def prepared_transactions(conn: psycopg.Connection) -> PreparedTransactions:
    """What the server allows and what is prepared in this database now (read-only)."""
    row = conn.execute(
        "SELECT current_setting('max_prepared_transactions')::int, "
        "(SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())"
    ).fetchone()
    assert row is not None
    return PreparedTransactions(int(row[0]), int(row[1]))


def notify_breaks_two_phase(seen: PreparedTransactions, outbox: str) -> str | None:
    """Why the NOTIFY trigger may break this server's writers (with the fix), or None when the server
    refuses PREPARE TRANSACTION anyway."""
    if seen.allowed <= 0:
        return None
    now = f", {seen.prepared} prepared in this database now" if seen.prepared else ""
    return (
        f"max_prepared_transactions = {seen.allowed} on this server{now}: a writer that inserts into {outbox} "
        f"and then runs PREPARE TRANSACTION (XA / JTA two-phase commit) fails with the NOTIFY trigger "
        f"('cannot PREPARE a transaction that has executed LISTEN, UNLISTEN, or NOTIFY')"
    )


#: What to do about :func:`notify_breaks_two_phase`.
TWO_PHASE_FIX = (
    "if any writer does, set wakeup: poll and run `harvest init-db` again (it drops the trigger; rows then wait "
    "up to one idle poll, 100ms by default), else set wakeup: notify (keeps the trigger, silences this)"
)
