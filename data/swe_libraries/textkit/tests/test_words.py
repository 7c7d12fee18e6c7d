import unittest

from textkit import count_vowels, is_palindrome, slugify, word_count


class SlugifyTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_separator(self):
        self.assertEqual(slugify("Rock and Roll", separator="_"), "rock_and_roll")

    def test_digits(self):
        self.assertEqual(slugify("Top 10 lists"), "top-10-lists")

    def test_empty(self):
        self.assertEqual(slugify("  ...  "), "")


class WordCountTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(word_count("one two  three"), 3)

    def test_blank(self):
        self.assertEqual(word_count("   "), 0)


class VowelTest(unittest.TestCase):
    def test_mixed_case(self):
        self.assertEqual(count_vowels("Education"), 5)

    def test_none(self):
        self.assertEqual(count_vowels("rhythm"), 0)


class PalindromeTest(unittest.TestCase):
    def test_sentence(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))

    def test_not(self):
        self.assertFalse(is_palindrome("palindrome"))

    def test_digits(self):
        self.assertTrue(is_palindrome("12321"))
