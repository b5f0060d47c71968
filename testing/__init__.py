"""Pytest plugin for bolide users: an embedded-broker cluster and fresh streams."""
