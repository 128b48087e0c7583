"""Operations: the ``harvest`` CLI, its commands (check, dead letters) and the preflight checks."""
