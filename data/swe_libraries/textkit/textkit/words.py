"""Looking at the words and letters of a text."""

VOWELS = "aeiou"


def slugify(text, separator="-"):
    """The runs of letters and digits of `text`, lowercased, joined by `separator`."""
    words = []
    current = ""
    for char in text.lower():
        if char.isalnum():
            current += char
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return separator.join(words)


def word_count(text):
    """How many whitespace-separated words `text` has."""
    return len(text.split())


def count_vowels(text):
    """How many of the letters of `text` are vowels (a, e, i, o, u, in either case)."""
    return sum(1 for char in text.lower() if char in VOWELS)


def is_palindrome(text):
    """Whether the letters and digits of `text` read the same backwards, ignoring case."""
    letters = [char.lower() for char in text if char.isalnum()]
    return letters == letters[::-1]
