"""Text that comes from traces, engines or run files (tenants, adapters, request ids, the hash
algorithm and vLLM version an engine reports, model names, engine ids, file names), made safe
to show in each of kvscope's outputs. Every output calls these; none escapes on its own.

A label is untrusted text: a newline would break a Markdown table, `![x](http://...)` would
fetch an image, `<img onerror=...>` would run in an HTML page, an escape sequence would
repaint a terminal, a control character would make XML invalid.

| output | function |
| --- | --- |
| terminal text, JUnit XML (ElementTree escapes the markup) | `shown` |
| Markdown, as a code span (names, ids, versions) | `code` |
| Markdown, as plain text (a sentence that quotes a name) | `markdown_text` |
| HTML, and a chart's labels (Plotly draws `<a href>` in them as a link) | `html_text` |

All start from `shown`: one line, unprintable characters written as escapes, at most 256
characters (a sentence made of names each shown already passes `limit=None`).
"""

from __future__ import annotations

MAX_SHOWN = 256

# Entities Plotly reads back too (it knows amp, lt, gt and numbers, not quot or apos).
_HTML = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})

# What lets text leave a Markdown table's cell (pipes), become a link or an image (brackets,
# parentheses, bangs), HTML (angle brackets, ampersands) or code (backticks); emphasis is
# left alone.
_MARKDOWN = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", **{mark: "\\" + mark for mark in "`[]()!|"}}
)


def shown(text: object, limit: int | None = MAX_SHOWN) -> str:
    """`text` on one line, unprintable characters written as escapes, at most `limit`
    characters (None: a sentence whose names were each shown already)."""
    value = "".join(
        character if character.isprintable() else ascii(character)[1:-1] for character in str(text)
    )
    return value if limit is None or len(value) <= limit else value[: limit - 3] + "..."


def code(text: object) -> str:
    """`text` as a Markdown code span (backticks inside become quotes; pipes are escaped, as
    GitHub's tables want even inside code)."""
    return "`" + shown(text).replace("`", "'").replace("|", "\\|") + "`"


def markdown_text(text: object, limit: int | None = MAX_SHOWN) -> str:
    """`text` as plain Markdown, safe inside a table cell: one line, no pipes, no raw HTML,
    no links or images."""
    return shown(text, limit).translate(_MARKDOWN)


def html_text(text: object, limit: int | None = MAX_SHOWN) -> str:
    """`text` as HTML text or a quoted attribute's value; Plotly reads the same entities back
    in a chart's labels, so a tag there is shown, not drawn."""
    return shown(text, limit).translate(_HTML)
