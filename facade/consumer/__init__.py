"""The subscriber core: a subscriber's consumer, its partitions' state (assignment, positions,
confirms, holds), fetching, the group lease, durable and shared-fetch plumbing, and the
``Lifecycle`` every kind of subscriber shares. Not API: the public side is
``bolide.facade.subscriber``; this package may change without notice."""
