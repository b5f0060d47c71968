"""Working parts of the subscriber and its receivers (positions, fetching, confirms, the
parallel receiver's lanes, workers and outcomes): not API, may change without notice."""
