"""Answer-extraction helpers shared by the math scorers: the last ``\\boxed{...}`` and text cleanup.

`last_boxed_content` finds the last ``\\boxed`` or ``\\fbox`` command in a response and returns
what it encloses, matching braces so that ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. The
brace-less form ``\\boxed 5`` (seen in MATH solutions) gives the next token. The *last* command
decides: when it is truncated (``\\boxed{12`` at the end of a cut-off response) the result is None
rather than an earlier box, because the model's final answer is then missing.

`normalize_unicode` maps the characters models emit for ASCII math symbols (U+2212 minus, en/em
dash used as minus, non-breaking and thin spaces, full-width digits) onto ASCII, so every scorer
reads ``−3`` as ``-3``.
"""

from __future__ import annotations

import re
import unicodedata

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")

_UNICODE_MAP = str.maketrans(
    {
        "\u2212": "-",  # minus sign
        "\u2013": "-",  # en dash
        "\u2014": "-",  # em dash
        "\u2012": "-",  # figure dash
        "\ufe63": "-",  # small hyphen-minus
        "\uff0d": "-",  # full-width hyphen-minus
        "\u00a0": " ",  # no-break space
        "\u2009": " ",  # thin space
        "\u202f": " ",  # narrow no-break space
        "\u00d7": "*",  # multiplication sign
        "\u00f7": "/",  # division sign
    }
)


def normalize_unicode(text: str) -> str:
    """ASCII-fy math symbols and full-width characters (NFKC), keep everything else."""
    return unicodedata.normalize("NFKC", text).translate(_UNICODE_MAP)


def _match_brace(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at `open_idx`, or None when it is never closed."""
    depth = 0
    for i in range(open_idx, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed_span(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last box command in `text`; None if absent or malformed.

    `text[start:end]` is the whole command (``\\boxed{...}``), `content` what it encloses.
    """
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    i = m.end()
    if i < len(text) and text[i] == "{":
        close = _match_brace(text, i)
        if close is None:
            return None
        return m.start(), close + 1, text[i + 1 : close]
    # brace-less form: "\boxed 5" -> "5" (up to whitespace or a closing "$")
    rest = text[i:]
    token = re.match(r"\s+([^\s$]+)", rest)
    if token is None:
        return None
    return m.start(), i + token.end(), token.group(1)


def last_boxed_content(text: str) -> str | None:
    """What the last ``\\boxed``/``\\fbox`` encloses, stripped; None when there is no usable box."""
    span = last_boxed_span(text)
    if span is None:
        return None
    content = span[2].strip()
    return content if content else None


def strip_latex_answer(answer: str) -> str:
    """A plain-string normal form for a short math answer, used where symbolic checking fails.

    Removes whitespace, ``$``, ``\\left``/``\\right``, ``\\!``, ``\\,``, degree marks and a
    trailing period; ``dfrac``/``tfrac`` become ``frac``; ``\\text{x}`` becomes ``x``; a leading
    ``x =`` is dropped; ``0.5`` and ``.5`` agree; thousands commas in plain integers go.
    """
    s = normalize_unicode(answer).strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "").replace("%", "")
    s = s.replace("$", "")
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if re.fullmatch(r"[A-Za-z]\w*=.+", s):
        s = s.split("=", 1)[1]
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    if s.startswith("."):
        s = "0" + s
    s = s.replace("-.", "-0.")
    return s
