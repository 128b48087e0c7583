"""goharvest's layout: the mark statement and how many rows the next mark claims."""
