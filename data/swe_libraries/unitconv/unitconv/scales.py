"""Units that are a multiple of a base unit: lengths (metres) and masses (grams)."""

LENGTHS = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "yd": 0.9144, "mi": 1609.344}
MASSES = {"mg": 0.001, "g": 1.0, "kg": 1000.0, "oz": 28.349523125, "lb": 453.59237}


def _scale_of(unit):
    for scale in (LENGTHS, MASSES):
        if unit in scale:
            return scale
    raise ValueError(f"unknown unit {unit!r}")


def convert(value, from_unit, to_unit):
    """`value` in `from_unit` expressed in `to_unit`; both must measure the same thing."""
    scale = _scale_of(from_unit)
    if to_unit not in scale:
        raise ValueError(f"cannot convert {from_unit} to {to_unit}")
    return value * scale[from_unit] / scale[to_unit]


def format_quantity(value, unit, digits=2):
    """`value` rounded to `digits` decimals, trailing zeros dropped, then the unit: `1.5 km`."""
    text = f"{value:.{digits}f}"
    if digits > 0:
        text = text.rstrip("0").rstrip(".")
    return f"{text} {unit}"


def parse_quantity(text):
    """`(value, unit)` of a quantity written as `12.5 km`."""
    parts = text.split()
    if len(parts) != 2:
        raise ValueError(f"expected a number and a unit, got {text!r}")
    number, unit = parts
    _scale_of(unit)
    return float(number), unit
