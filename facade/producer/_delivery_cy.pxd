# The C layout of the delivery type when Cython compiles _delivery_cy.py: each slot a C field,
# still readable and writable from Python (public), as the __slots__ of the Python class are.
cdef class Delivery:
    cdef public object callback, outstanding, record
