"""consumer package."""
