"""Helpers shared by environments: example datasets and answer extraction."""
