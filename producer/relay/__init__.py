"""The relay's parts below the process (``producer/harvest.py``): the core its modes share, the modes, sharding, lifecycle."""
