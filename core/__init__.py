"""Hora."""
