"""Integers at every edge of Triton 3.6's size specialization (equal to 1, divisible by 16, the
32-bit, 64-bit and unsigned 64-bit ranges), shared by the tests of the Python and the native
class checks (test_bound_codes.py, test_native_bound_launch.py)."""

INT_VALUES = [
    0,
    1,
    2,
    15,
    16,
    17,
    33,
    1000,
    1024,
    -16,
    -17,
    2**31 - 16,
    2**31 - 1,
    2**31,
    2**31 + 16,
    -(2**31),
    -(2**31) - 1,
    2**40 + 3,
    2**62,
    2**63 - 16,
    2**63,
    2**63 + 16,
    2**64 - 16,
]
