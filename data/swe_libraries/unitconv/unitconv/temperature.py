"""Temperatures in Celsius (C), Fahrenheit (F) and Kelvin (K)."""

ABSOLUTE_ZERO_C = -273.15


def to_kelvin(value, unit):
    """`value` in `unit` as Kelvin; below absolute zero is an error."""
    if unit == "C":
        kelvin = value - ABSOLUTE_ZERO_C
    elif unit == "F":
        kelvin = (value - 32) * 5 / 9 - ABSOLUTE_ZERO_C
    elif unit == "K":
        kelvin = value
    else:
        raise ValueError(f"unknown temperature unit {unit!r}")
    if kelvin < 0:
        raise ValueError("below absolute zero")
    return kelvin


def from_kelvin(kelvin, unit):
    """A temperature in Kelvin expressed in `unit`."""
    if unit == "C":
        return kelvin + ABSOLUTE_ZERO_C
    if unit == "F":
        return (kelvin + ABSOLUTE_ZERO_C) * 9 / 5 + 32
    if unit == "K":
        return kelvin
    raise ValueError(f"unknown temperature unit {unit!r}")


def convert_temperature(value, from_unit, to_unit):
    """`value` in `from_unit` expressed in `to_unit`."""
    return from_kelvin(to_kelvin(value, from_unit), to_unit)
