"""The ``--uuid-sequencing`` mode: fenced harvest transactions, one concern per module."""
