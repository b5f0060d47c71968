"""The receivers beyond the plain one (``bolide.facade.receiver``): the parallel receiver
(``parallel``: ``ParallelReceiver``, ``ReceiverOptions``, ``new_receiver``) and its engine (the
board of records in flight, ``lanes``; the workers; what a worker does with a record,
``outcomes``; how polled batches reach the board, ``feed``; the retry tiers with their shelf,
reader, writer and fence), and a share group's receiver (``share``: ``ShareReceiver``). Their
public names (``ParallelReceiver``, ``ReceiverOptions``, ``ShareReceiver``) are exported by
``bolide.facade``; this package may change without notice."""
