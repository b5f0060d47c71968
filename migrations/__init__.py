"""Alembic migrations for every table the history store owns."""
