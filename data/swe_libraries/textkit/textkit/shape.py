"""Changing the shape of a text: cutting, padding, capitalising."""

MINOR_WORDS = ("a", "an", "and", "in", "of", "on", "or", "the", "to")


def truncate(text, width, ellipsis="..."):
    """`text` cut to at most `width` characters, ending in `ellipsis` when it was cut."""
    if width < len(ellipsis):
        raise ValueError("width is shorter than the ellipsis")
    if len(text) <= width:
        return text
    return text[: width - len(ellipsis)] + ellipsis


def pad_center(text, width, fill=" "):
    """`text` centred in `width` characters; an odd padding puts the extra character on the right."""
    if len(fill) != 1:
        raise ValueError("fill must be one character")
    missing = width - len(text)
    if missing <= 0:
        return text
    left = missing // 2
    right = missing - left
    return fill * left + text + fill * right


def title_case(text):
    """Every word capitalised, except minor words that are neither first nor last."""
    words = text.lower().split()
    titled = []
    for index, word in enumerate(words):
        if 0 < index < len(words) - 1 and word in MINOR_WORDS:
            titled.append(word)
        else:
            titled.append(word[:1].upper() + word[1:])
    return " ".join(titled)


def initials(name):
    """The first letter of each part of `name`, upper-cased, each followed by a dot."""
    return "".join(part[0].upper() + "." for part in name.split())
