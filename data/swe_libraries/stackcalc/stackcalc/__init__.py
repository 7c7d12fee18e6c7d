"""A reverse Polish notation calculator."""

from stackcalc.calculator import CalcError, evaluate
from stackcalc.infix import to_infix

__all__ = ["CalcError", "evaluate", "to_infix"]
