"""The ``--uuid-sequencing`` mode: fenced harvest transactions, one concern per module."""


def fast_path() -> str:
    """``native`` when the fill loop (``_native.pyx``) runs, ``python`` when the reference does (not built, or
    ``HARVEST_PURE_PYTHON=1``): what ``harvest --version`` reports."""
    from harvest_outbox.producer.relay.sequenced import _produce

    return "native" if _produce._native is not None else "python"
