"""Small text utilities."""

from textkit.shape import initials, pad_center, title_case, truncate
from textkit.words import count_vowels, is_palindrome, slugify, word_count

__all__ = ["count_vowels", "initials", "is_palindrome", "pad_center", "slugify", "title_case", "truncate", "word_count"]
