"""Internals of the core facade: not API. Modules here may change without notice."""
