# The C layout of the record type when Cython compiles _record_cy.py: every slot a C field,
# still readable and writable from Python (public), as the __slots__ of the Python class are.
cdef class Record:
    cdef public object _headers, data, delivery_count, group, key, offset, partition
    cdef public object replayed, stream, timestamp_ms, value
