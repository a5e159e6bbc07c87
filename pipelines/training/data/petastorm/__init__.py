"""Petastorm's reader: the mission stack's only (issue 39)."""
