"""The parallel receiver's engine: the board of records in flight (lanes), the workers, what
a worker does with a record (outcomes), how polled batches reach the board (feed), and the
retry tiers with their shelf. Not API: the public side is ``bolide.facade.parallel``; this
package may change without notice."""
