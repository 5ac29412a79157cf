"""Time to the first picture of a long text's head view (attnviz.notebook), at 1024 and 8192 tokens.

Two parts, timed apart and added: Python making the first frame from a tiled export (one pass over
the head's map for its normalisers and max-pooled overview, attnviz.notebook.frames.overview) and
chromium drawing it: the view's own script in a page that holds what the widget sends to the
browser (the view's state: the first frame's palette indices, weights and labels), from the page's
load to the map drawn. A third figure is mode="html": the self-contained page (every contrast of
the head embedded), made in Python and drawn. The model's forward pass that makes the queries and
keys is not counted: made-up queries and keys (d_head 64) stand in for it. Prints the CPU, the
threads and the load average, since other work on the same cores slows every figure.
Usage: python benchmarks/bench_notebook.py [--tokens 1024 8192] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnviz.devices import device_name
from attnviz.notebook import head_view, standalone
from attnviz.tiles import TiledAttention

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def made_up(tokens: int, d_head: int = 64, seed: int = 0) -> TiledAttention:
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, 1, tokens, d_head)).astype(np.float32) * 1.5
    k = rng.normal(size=(1, 1, tokens, d_head)).astype(np.float32)
    return TiledAttention({"decoder": q}, {"decoder": k}, None, tuple(f"w{i}" for i in range(tokens)), {})


def browser_ms(page, doc: Path) -> float:
    start = time.perf_counter()
    page.goto(doc.as_uri())
    page.wait_for_selector(".attnviz-head[data-drawn='1']")
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    print(f"CPU: {device_name(torch.device('cpu'))}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads")
    print("load average before: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    with sync_playwright() as p, tempfile.TemporaryDirectory() as folder:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        for n in args.tokens:
            tiled = made_up(n)
            python, drawing, html_python, html_drawing = [], [], [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                view = head_view(tiled, dtype="float16", mode="widget")  # a fresh view: nothing cached
                python.append((time.perf_counter() - start) * 1000)
                doc = Path(folder) / f"head{n}.html"
                doc.write_text(standalone.document(view.state(), {}, "head"))  # what the widget sends, no more
                drawing.append(browser_ms(page, doc))
                start = time.perf_counter()
                page_text = head_view(tiled, dtype="float16", mode="html").html()
                html_python.append((time.perf_counter() - start) * 1000)
                doc.write_text(page_text)
                html_drawing.append(browser_ms(page, doc))
            py, dr = float(np.median(python)), float(np.median(drawing))
            print(
                f"{n:>5} tokens: first frame in Python {py:7.0f} ms, drawn in chromium {dr:6.0f} ms, "
                f"total {py + dr:7.0f} ms (median of {args.repeat}); frame {view.frame['shape']} pixels of "
                f"{view.frame['blocks']} tokens, {len(view.indices) + len(view.weights):,} bytes"
            )
            hp, hd = float(np.median(html_python)), float(np.median(html_drawing))
            print(
                f"{'':>5}  mode='html': page made in Python {hp:7.0f} ms, drawn in chromium {hd:6.0f} ms, "
                f"total {hp + hd:7.0f} ms; {len(page_text):,} bytes"
            )
        browser.close()
    print("load average after: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
