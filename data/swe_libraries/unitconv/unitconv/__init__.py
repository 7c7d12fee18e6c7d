"""Unit conversion for lengths, masses and temperatures."""

from unitconv.scales import convert, format_quantity, parse_quantity
from unitconv.temperature import convert_temperature, to_kelvin

__all__ = ["convert", "convert_temperature", "format_quantity", "parse_quantity", "to_kelvin"]
