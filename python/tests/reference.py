"""Exact test data and expected results for the Python tests, with the core's semantics
(src/element.rs): integers wrap, their average truncates toward zero; floats are IEEE, the
narrow ones (float16, bfloat16, fp8) rounded to nearest-even (fp8 saturating) after each step,
and the average is the sum times the type's ``1/world`` (computed in float32 for the narrow
types).

Inputs depend on the rank and the index (a block sent to the wrong place shows). They are small
integers — a third of an unsigned type's with the top bit set, so that signedness shows — so
that every partial sum and product is exact in every float type whatever the fold order
(integers wrap, as the core's do): the expected values are exact, and results are compared bit
for bit.

Buffers come from one of two *backends*: ``array.array`` (always there; float16, bfloat16 and
fp8 as their bits in ``'H'`` or ``'B'`` arrays, passed with ``dtype=``) and NumPy (where it is
installed; float16 native).
"""

import array
import math
import struct


def _f32(x):
    """``x`` rounded to float32 (nearest-even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _f16_bits(x):
    return int.from_bytes(struct.pack("<e", x), "little")


def _f16_value(bits):
    return struct.unpack("<e", bits.to_bytes(2, "little"))[0]


def _bf16_bits(x):
    bits = int.from_bytes(struct.pack("<f", x), "little")
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _bf16_value(bits):
    return struct.unpack("<f", (bits << 16).to_bytes(4, "little"))[0]


def _fp8_table(exponent_bits, bias, has_inf):
    """Every finite value of an 8-bit float format, by code (NaNs and infinities left out)."""
    mantissa_bits = 7 - exponent_bits
    table = {}
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> mantissa_bits) & ((1 << exponent_bits) - 1)
        m = code & ((1 << mantissa_bits) - 1)
        top = (1 << exponent_bits) - 1
        if has_inf and e == top:
            continue  # e5m2: infinities and NaNs
        if not has_inf and e == top and m == (1 << mantissa_bits) - 1:
            continue  # e4m3: S.1111.111 is NaN
        if e == 0:
            value = m / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + m / (1 << mantissa_bits)) * 2.0 ** (e - bias)
        table[code] = sign * value
    return table


_E4M3 = _fp8_table(4, 7, has_inf=False)
_E5M2 = _fp8_table(5, 15, has_inf=True)


def _fp8_encoder(table):
    largest = max(table.values())

    def encode(x):
        """Nearest code, ties to an even code, saturating at the largest finite value."""
        x = max(-largest, min(largest, x))
        best = min(
            table.items(),
            key=lambda item: (
                abs(item[1] - x),
                item[0] & 1,
                math.copysign(1, item[1]) != math.copysign(1, x),
            ),
        )
        return best[0]

    return encode


class Type:
    """One element type as the tests see it: how its values are stored in a buffer element
    (a *code*: the value itself, or its bits), rounded, and compared."""

    def __init__(
        self, name, kind, size, typecode, numpy_name, encode=None, decode=None, dtype_arg=None
    ):
        self.name, self.kind, self.size = name, kind, size
        self.typecode = typecode  # array.array's
        self.numpy_name = numpy_name
        self.encode = encode  # value -> bits, for types stored as bits
        self.decode = decode
        self.dtype_arg = dtype_arg  # what dtype= must say (None: the buffer's format says it)

    def __repr__(self):
        return self.name

    def code(self, value):
        return self.encode(value) if self.encode else value

    def value(self, code):
        return self.decode(code) if self.decode else code

    def key(self, code):
        """What must match bit for bit (a float's sign of zero included)."""
        if self.kind == "float" and not self.encode:
            return struct.pack("<f" if self.size == 4 else "<d", code)
        return code

    def round(self, x):
        """A real value as this type holds it (integers wrap)."""
        if self.kind in ("int", "uint"):
            bits = 8 * self.size
            x %= 1 << bits
            if self.kind == "int" and x >= 1 << (bits - 1):
                x -= 1 << bits
            return x
        if self.encode:
            return self.decode(self.encode(x))
        return _f32(x) if self.size == 4 else x

    def input(self, rank, index):
        """Rank ``rank``'s element ``index``: small, signed where the type is; a third of an
        unsigned type's have the top bit set."""
        if self.name.startswith("f8"):
            return float(((index * 7 + rank * 3) % 5) - 2)
        if self.kind == "uint":  # a third of them above the signed range: signedness shows
            high = 1 << (8 * self.size - 1) if (index + rank) % 3 == 0 else 0
            return high + (index * 7 + rank * 3) % 11
        value = ((index * 7 + rank * 3) % 11) - 5
        return float(value) if self.kind == "float" else value

    def reduce(self, op, values, world):
        """The core's result of ``op`` over ``values`` (every partial result is exact)."""
        if op == "min":
            return min(values)
        if op == "max":
            return max(values)
        if op == "prod":
            return self.round(math.prod(values))
        total = self.round(sum(values))
        if op == "sum":
            return total
        assert op == "avg", op
        if self.kind in ("int", "uint"):
            quotient = abs(total) // world
            return quotient if total >= 0 else -quotient
        if self.size == 8 and not self.encode:
            return total * (1.0 / world)
        return self.round(_f32(total * _f32(1.0 / world)))


TYPES = [
    Type("f16", "float", 2, "H", "float16", _f16_bits, _f16_value, dtype_arg="float16"),
    Type("bf16", "float", 2, "H", None, _bf16_bits, _bf16_value, dtype_arg="bfloat16"),
    Type("f32", "float", 4, "f", "float32"),
    Type("f64", "float", 8, "d", "float64"),
    Type("i8", "int", 1, "b", "int8"),
    Type("u8", "uint", 1, "B", "uint8"),
    Type("i32", "int", 4, "i", "int32"),
    Type("u32", "uint", 4, "I", "uint32"),
    Type("i64", "int", 8, "q", "int64"),
    Type("u64", "uint", 8, "Q", "uint64"),
    Type(
        "f8e4m3", "float", 1, "B", None, _fp8_encoder(_E4M3), _E4M3.get, dtype_arg="float8_e4m3fn"
    ),
    Type("f8e5m2", "float", 1, "B", None, _fp8_encoder(_E5M2), _E5M2.get, dtype_arg="float8_e5m2"),
]

OPS = ["sum", "prod", "min", "max", "avg"]


class ArrayBackend:
    """Buffers as ``array.array``: float16, bfloat16 and fp8 as bits, named by ``dtype=``."""

    name = "array"

    def make(self, t, values):
        assert array.array(t.typecode).itemsize == t.size, (t, t.typecode)
        return array.array(t.typecode, [t.code(v) for v in values])

    def dtype(self, t):
        return t.dtype_arg

    def codes(self, buf):
        return list(buf)


class NumpyBackend:
    """Buffers as NumPy arrays: float16 native, bfloat16 and fp8 as uint16 / uint8 bits."""

    name = "numpy"

    def __init__(self, numpy):
        self.np = numpy

    def make(self, t, values):
        if t.numpy_name and t.name != "f16":
            return self.np.array(values, dtype=t.numpy_name)
        if t.name == "f16":
            return self.np.array(values, dtype="float16")
        bits = "uint16" if t.size == 2 else "uint8"
        return self.np.array([t.code(v) for v in values], dtype=bits)

    def dtype(self, t):
        return None if t.numpy_name else t.dtype_arg

    def codes(self, buf):
        if buf.dtype == self.np.float16:
            return [_f16_bits(float(v)) for v in buf]
        return buf.tolist()
