"""Interactive flame graph as one SVG file: hover details, click to zoom, search, diff colours.

Each frame is a <g> with data attributes (name, kind, seconds, parent id), so the drawing can
be checked by structure rather than by pixels. Widths are CPU seconds over the window.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from importlib import resources

from ..analysis.stacks import Stack, Stacks

WIDTH = 1200
ROW = 17
PAD_TOP = 46
MIN_WIDTH_PX = 0.3
KIND_COLOURS = {
    "python": "#f2c94c",
    "native": "#f2994a",
    "kernel": "#eb5757",
    "openmp": "#9b8fe0",
    "pool-work": "#6fcf97",
    "profkit": "#bdbdbd",
}


@dataclass
class Tree:
    name: str
    kind: str
    seconds: float = 0.0
    children: dict[tuple[str, str], Tree] = field(default_factory=dict)


def build_tree(weights: dict[Stack, float], root_name: str = "all") -> Tree:
    root = Tree(root_name, "profkit")
    for stack, seconds in weights.items():
        node = root
        node.seconds += seconds
        for frame in stack:
            key = (frame.name, frame.kind)
            node = node.children.setdefault(key, Tree(frame.name, frame.kind))
            node.seconds += seconds
    # A single synthetic root ("process") becomes the tree itself.
    if len(root.children) == 1:
        only = next(iter(root.children.values()))
        if abs(only.seconds - root.seconds) < 1e-12 and only.kind == "profkit":
            return only
    return root


def _paths(tree: Tree, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], float]:
    out = {(*prefix, tree.name): tree.seconds}
    for child in tree.children.values():
        out.update(_paths(child, (*prefix, tree.name)))
    return out


def _diff_colour(delta: float) -> str:
    strength = min(1.0, abs(delta) / 0.2)
    shade = int(235 - 140 * strength)
    return f"rgb(235,{shade},{shade})" if delta > 0 else f"rgb({shade},{shade},235)"


def render_svg(stacks: Stacks, title: str, other: Stacks | None = None) -> str:
    tree = build_tree(stacks.weights)
    total = tree.seconds or 1e-12
    other_shares: dict[tuple[str, ...], float] = {}
    if other is not None:
        other_tree = build_tree(other.weights)
        other_shares = {p: v / (other_tree.seconds or 1e-12) for p, v in _paths(other_tree).items()}
    rows: list[str] = []
    depth_max = [0]
    counter = [0]

    def draw(node: Tree, x: float, depth: int, parent: str, path: tuple[str, ...]) -> None:
        width = node.seconds / total * WIDTH
        if width < MIN_WIDTH_PX:
            return
        counter[0] += 1
        ident = f"f{counter[0]}"
        depth_max[0] = max(depth_max[0], depth)
        share = node.seconds / total
        cores = node.seconds / max(stacks.window_seconds, 1e-9)
        path = (*path, node.name)
        fill = KIND_COLOURS.get(node.kind, "#cccccc")
        extra = ""
        if other is not None:
            delta = share - other_shares.get(path, 0.0)
            fill = _diff_colour(delta)
            extra = f"; {100 * delta:+.1f} points vs the other bundle"
        label = html.escape(node.name)
        tip = (
            f"{label} [{node.kind}]: {node.seconds:.3f} s, {cores:.2f} cores, "
            f"{100 * share:.1f}%{extra}"
        )
        rows.append(
            f'<g class="frame" id="{ident}" data-parent="{parent}" data-name="{label}" '
            f'data-kind="{node.kind}" data-seconds="{node.seconds:.6f}" data-depth="{depth}" '
            f'data-x="{x:.3f}" data-w="{width:.3f}"><title>{tip}</title>'
            f'<rect x="{x:.3f}" y="0" width="{width:.3f}" height="{ROW - 1}" fill="{fill}" '
            f'rx="2"/><text x="{x + 3:.3f}" y="0"></text></g>'
        )
        child_x = x
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, child_x, depth + 1, ident, path)
            child_x += child.seconds / total * WIDTH

    draw(tree, 0.0, 0, "", ())
    height = PAD_TOP + (depth_max[0] + 1) * ROW + 30
    subtitle = (
        f"{stacks.view} view: {total:.2f} s over {stacks.window_seconds:.1f} s "
        f"({total / max(stacks.window_seconds, 1e-9):.2f} cores)"
    )
    legend = "  ".join(f"{kind}" for kind in KIND_COLOURS)
    return SVG_TEMPLATE.format(
        width=WIDTH,
        height=height,
        title=html.escape(title),
        subtitle=html.escape(subtitle),
        frames="\n".join(rows),
        row=ROW,
        pad=PAD_TOP,
        legend=legend,
        script=SCRIPT,
        bottom=height - 8,
    )


SVG_TEMPLATE = """<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" height="{height}"
     viewBox="0 0 {width} {height}" font-family="monospace" font-size="11" id="flame"
     data-row="{row}" data-pad="{pad}">
<style>
  .frame text {{ pointer-events: none; fill: #000; }}
  .frame rect:hover {{ stroke: #000; stroke-width: 0.7; }}
  .frame.match rect {{ fill: #e0409a !important; }}
  .frame.hidden {{ display: none; }}
  .control {{ cursor: pointer; fill: #1f4e99; }}
</style>
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{width}" dx="-8" y="16" text-anchor="end" class="control" id="search-button">Search</text>
<text x="{width}" dx="-70" y="16" text-anchor="end" class="control"
      id="reset-button">Reset zoom</text>
<text x="8" y="16" font-size="14">{title}</text>
<text x="8" y="32" fill="#555">{subtitle}</text>
<text x="8" y="{bottom}" id="details" fill="#333"> </text>
<text x="{width}" dx="-8" y="{bottom}" text-anchor="end" id="matched" fill="#e0409a"> </text>
<g id="frames">
{frames}
</g>
<script type="text/javascript"><![CDATA[
{script}
]]></script>
</svg>
"""

# The SVG's script (search, zoom, details), a file of its own beside this module.
SCRIPT = "\n" + resources.files(__package__).joinpath("flame.js").read_text()
