"""The outbox side: schema, stasher, the harvest relay (MP/R + NELI) and the ``harvest`` CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("harvest")
except PackageNotFoundError:  # running from a checkout without installing
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
