"""The subscriber core: a subscriber's consumer, its partitions' state (assignment, positions,
confirms, holds), fetching, the group lease, durable and shared-fetch plumbing. Not API: the
public side is ``bolide.facade.subscriber``; this package may change without notice."""
