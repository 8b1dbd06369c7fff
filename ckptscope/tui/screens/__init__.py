"""Screens orchestrate widgets and run the workers that call ``ops``."""
