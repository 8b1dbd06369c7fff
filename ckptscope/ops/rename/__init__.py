"""``rename``: name changes checked up front, the shared engine, and one writer per checkpoint format."""
