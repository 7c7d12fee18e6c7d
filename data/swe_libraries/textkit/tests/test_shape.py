import unittest

from textkit import initials, pad_center, title_case, truncate


class TruncateTest(unittest.TestCase):
    def test_short_text_unchanged(self):
        self.assertEqual(truncate("short", 10), "short")

    def test_exact_width_unchanged(self):
        self.assertEqual(truncate("exactly10!", 10), "exactly10!")

    def test_cut(self):
        self.assertEqual(truncate("a long sentence", 8), "a lon...")

    def test_custom_ellipsis(self):
        self.assertEqual(truncate("abcdefgh", 5, ellipsis="~"), "abcd~")

    def test_width_too_small(self):
        with self.assertRaises(ValueError):
            truncate("abcdef", 2)


class PadCenterTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(pad_center("ab", 6), "  ab  ")

    def test_odd(self):
        self.assertEqual(pad_center("ab", 5, fill="*"), "*ab**")

    def test_too_long(self):
        self.assertEqual(pad_center("abcdef", 4), "abcdef")

    def test_bad_fill(self):
        with self.assertRaises(ValueError):
            pad_center("ab", 6, fill="--")


class TitleCaseTest(unittest.TestCase):
    def test_minor_words(self):
        self.assertEqual(title_case("the lord of the rings"), "The Lord of the Rings")

    def test_last_word(self):
        self.assertEqual(title_case("what it is made of"), "What It Is Made Of")

    def test_single(self):
        self.assertEqual(title_case("and"), "And")


class InitialsTest(unittest.TestCase):
    def test_two_names(self):
        self.assertEqual(initials("ada lovelace"), "A.L.")

    def test_three_names(self):
        self.assertEqual(initials("Grace  Brewster Hopper"), "G.B.H.")
