"""Names a target supplies, made safe to show: one function for every output.

A target chooses its functions' names (co_name and co_qualname can be anything, through
`code.replace`), its file names, its native symbols, its threads' names, its mapped files' paths
and its command line. profkit prints them on terminals, writes them into formats made of lines
(folded stacks) and into XML (the flame SVG, the HTML report), and sends them as Prometheus
labels. A newline in a name would forge a folded line, an ESC byte would reach the terminal of
whoever `cat`s a file, and one C0 byte makes an SVG ill-formed XML that browsers refuse to draw.

So every name passes through `shown()` before it is kept, whatever output it then reaches:

- characters that do not print (C0 and C1 controls, DEL, and the format characters that reorder
  or hide text, such as U+202E) are written as visible escapes: `\\x1b`, `\\x0a`, `\\u202e`;
- at most `MAX_NAME_CHARS` characters are kept, the rest said as `…[+N chars]`.

Frames apply it as they are made (bundle/frames.py), the bundle's reader to every string it
reads (bundle/load.py, with the larger MAX_TEXT_CHARS), `watch` to its labels. What is left to
each format is its own syntax: `;` in folded, XML escaping in SVG and HTML.
"""

from __future__ import annotations

# A frame's name or file past this is cut: longer than any real qualified name or path a
# report needs, short enough that one name cannot make a flame graph or a folded line huge.
MAX_NAME_CHARS = 1024
# Any other string a bundle holds (command lines, notes, paths in warnings).
MAX_TEXT_CHARS = 16384


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """The name as it may be shown anywhere: every character that does not print escaped
    visibly, and at most `limit` characters of it kept."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    if len(text) > limit:
        text = f"{text[:limit]}…[+{len(text) - limit} chars]"
    return text


def folded_frame(name: str) -> str:
    """A frame's name in folded stacks, where `;` separates frames and a line is a stack."""
    return shown(name).replace(";", ":")
