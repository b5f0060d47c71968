"""A publisher's working parts: its outstanding deliveries and their futures, and its
transactions. Not API: the public side is ``bolide.facade.publisher``; this package may
change without notice."""
