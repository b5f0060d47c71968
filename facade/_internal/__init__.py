"""Low-level helpers shared across the core facade (closing, locking, holds, delivery
futures, transactions): not API, may change without notice."""
