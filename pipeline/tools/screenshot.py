"""Retake ``docs/viewer.png`` from a run's ``reports/episodes.html``.

    python -m pipeline.tools.screenshot                       # reports/episodes.html -> docs/viewer.png
    python -m pipeline.tools.screenshot --html X.html --out /tmp/v.png

C1 beside C2 (the viewer's default pair) on the first task C2 won and C1 did not, opened in
the headless Chromium the viewer's browser test drives (Debian's ``/usr/bin/chromium`` through
the ``playwright`` package; ``bash .ci/install_browser.sh`` installs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.core.config import project_root

CHROMIUM = "/usr/bin/chromium"


def take(html: Path, out: Path, *, width: int = 1400, height: int = 900) -> str:
    """Screenshot ``html`` at its first C2-won / C1-lost task into ``out``; the task's title."""
    from playwright.sync_api import sync_playwright  # deferred: only this tool and the browser test use it

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(html.resolve().as_uri())
            page.locator("#index tbody tr").first.wait_for()
            options = page.locator("#f-outcome option").evaluate_all("os => os.map(o => o.value)")
            won = [o for o in options if o.endswith("|C2|C1") and o.startswith("tw")]
            if won:
                page.select_option("#f-outcome", won[0])
            page.locator("#index tbody tr:visible").first.locator("td:nth-child(4)").click()
            page.locator("#turns").wait_for()
            page.wait_for_timeout(300)
            page.screenshot(path=str(out))
            return page.inner_text("#task-title")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    root = project_root()
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.screenshot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", type=Path, default=root / "reports" / "episodes.html")
    ap.add_argument("--out", type=Path, default=root / "docs" / "viewer.png")
    args = ap.parse_args(argv)
    if not args.html.is_file():
        print(f"error: {args.html} not found: run `dvc repro compare` (or `python -m pipeline.view`) first",
              file=sys.stderr)
        return 1
    if not Path(CHROMIUM).is_file():
        print(f"error: {CHROMIUM} not found: `bash .ci/install_browser.sh`", file=sys.stderr)
        return 1
    title = take(args.html, args.out)
    print(f"wrote {args.out}: {title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
