"""Widgets: each shows data it is given (attributes down) and posts messages (up)."""
