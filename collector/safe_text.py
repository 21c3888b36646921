"""Labels that come from traces, engines or run files (tenants, adapters, request ids), made
safe to show: in a terminal, in Markdown (a pull-request comment, the app) and in XML.

A label is untrusted text: a newline would break a Markdown table, `![x](http://...)` would
fetch an image, an escape sequence would repaint a terminal, a control character would make
XML invalid. `shown` writes such characters as escapes; `code` puts the result in a Markdown
code span, which shows it literally, never as a link, an image or HTML.
"""

from __future__ import annotations

MAX_SHOWN = 256


def shown(text: object) -> str:
    """`text` on one line, unprintable characters written as escapes, at most 256 characters."""
    value = "".join(
        character if character.isprintable() else ascii(character)[1:-1] for character in str(text)
    )
    return value if len(value) <= MAX_SHOWN else value[: MAX_SHOWN - 3] + "..."


def code(text: object) -> str:
    """`text` as a Markdown code span (backticks inside become quotes; pipes are escaped, as
    GitHub's tables want even inside code)."""
    return "`" + shown(text).replace("`", "'").replace("|", "\\|") + "`"
