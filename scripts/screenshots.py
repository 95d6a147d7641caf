"""Render the docs' screenshots from the recorded fan-out bundle in headless Chromium.

.venv/bin/python scripts/screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profkit.analysis.pipeline import analyse_bundle  # noqa: E402
from profkit.analysis.stacks import build  # noqa: E402
from profkit.render.flame_svg import render_svg  # noqa: E402
from profkit.render.html_report import render_html  # noqa: E402
from tests.consumers import browser_page, serve  # noqa: E402

OUT = ROOT / "docs/images"


def main() -> int:
    report = analyse_bundle(ROOT / "tests/data/fanout_quota")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        site = Path(scratch)
        (site / "flame.svg").write_text(render_svg(build(report, "merged"), "merged flame graph"))
        (site / "report.html").write_text(render_html(report))
        with serve(site) as base, browser_page() as (page, errors):
            page.goto(f"{base}/flame.svg")
            page.evaluate("window.profkitSearch('direct_copy_kernel')")
            page.screenshot(path=str(OUT / "flame-merged.png"))
            page.goto(f"{base}/report.html")
            page.screenshot(path=str(OUT / "report.png"), full_page=True)
            if errors:
                print("\n".join(errors), file=sys.stderr)
                return 1
    print(f"wrote {OUT}/flame-merged.png and {OUT}/report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
