"""Long inputs in a real browser: bytes over the websocket and time until drawn, per view.

Run it from the repository root (it starts its own app server on 127.0.0.1 and stops it):

```bash
python benchmarks/bench_render.py            # the targets of issue 14, a few minutes
python benchmarks/bench_render.py --quick    # small sizes: a smoke run (what the test suite does)
```

It needs Debian's chromium (/usr/bin/chromium) and playwright. For each measure, a page is opened
from a link (the forward pass then runs and is cached), then one widget changes the view (the
contrast, from linear to logarithmic: a whole new figure of the same size) and the script counts
the bytes the server sends over the websocket (playwright's frames) from the click until the
figure is drawn: the server's rerun, the transfer, and the browser's drawing, up to two animation
frames after the new figure is in the page. "Cold" is the first opening from the link, forward
pass and app start included, for information.

```text
one head   a random attnviz model whose positions allow 1024 tokens (built here, seeded), its
           encoder self-attention of a 1024-token sentence, one head at full resolution.
           Targets: <= 1.5 MB and drawn <= 2 s.
grid       every layer and head (6 x 12) of MiniLM at 512 tokens (a random model of MiniLM's
           shape when MiniLM is not installed). Targets: <= 3 MB and drawn <= 3 s.
variants   one head of 1024 x 1024 drawn three ways by a throwaway page: the plotly heatmap of
           float32 numbers attnviz drew before, the plotly Image trace of a palette PNG it draws
           now, and a bare canvas component (streamlit components v2, inline JavaScript, no axes,
           no colour bar, no zoom) drawing the same PNG: what the choice was made on.
```
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import textwrap
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_class import app_server, cpu_name  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [  # as tests/test_browser.py: a closed network, no sandbox as root
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TARGETS = {"one head": (1.5, 2.0), "grid": (3.0, 3.0)}  # (MB, seconds)
LONG_TARGETS = {"first": (3.0, 3.0), "zoom": (None, 1.0)}  # a long text's head: (MB, seconds)
CUSTOM_PATH = "A checkpoint directory…"  # attnviz.app.session.CUSTOM_PATH: the sidebar's path choice
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# ---------------------------------------------------------------------------------------------
# Models and sentences


def build_random_model(folder: Path, max_len: int, n_layers: int = 2, n_heads: int = 4, d_model: int = 64) -> Path:
    """A random (seeded) attnviz checkpoint whose positions allow ``max_len`` tokens, with a letter tokenizer.

    The tokenizer knows the 26 letters as words ("▁a"), so `letters` of n letters is n + 1 tokens.
    """
    return _random_checkpoint(
        folder, n_enc_layers=n_layers, n_dec_layers=n_layers, d_model=d_model, n_heads=n_heads, max_len=max_len
    )


def build_random_lm(folder: Path, max_len: int, n_layers: int = 2, n_heads: int = 4, d_model: int = 64) -> Path:
    """A random (seeded) language model of the Llama layout (rotary positions, RMSNorm, SwiGLU, two key/value
    heads) whose positions allow ``max_len`` tokens, with the letter tokenizer: `letters` of n
    letters is n + 1 tokens, a BOS first."""
    return _random_checkpoint(
        folder,
        n_enc_layers=0,
        n_dec_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=2,
        max_len=max_len,
        pos_encoding="rotary",
        norm_first=True,
        norm="rmsnorm",
        ffn="gated",
        activation="swish",
        attn_bias=False,
        ffn_bias=False,
        scale_embedding=False,
    )


def _random_checkpoint(folder: Path, **config) -> Path:
    """A seeded random model of ``config`` (a TransformerConfig's fields) over the letter tokenizer, saved."""
    import sentencepiece
    import torch

    from attnviz.checkpoints.native import save_checkpoint
    from attnviz.model import Transformer, TransformerConfig
    from attnviz.tokenizer import train_sentencepiece

    sentences = [" ".join(LETTERS[(i + j) % 26] for j in range(12)) for i in range(200)]
    spm = train_sentencepiece(sentences, vocab_size=64, model_type="bpe")  # every "▁x" a piece
    vocab = sentencepiece.SentencePieceProcessor(model_proto=spm).get_piece_size()
    d_model = config["d_model"]
    cfg = TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_ff=2 * d_model, dropout=0.0, **config)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper than the initialisation's near-uniform attention, so images are not flat
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
    info = {"name": folder.name, "examples": [letters(12)]}
    return save_checkpoint(model, folder, spm, info, f"# {folder.name}\n\nRandom weights, for benchmarks and tests.\n")


def letters(n: int) -> str:
    """n letters separated by spaces: n + 1 source tokens for `build_random_model`'s tokenizer."""
    return " ".join(LETTERS[i % 26] for i in range(n))


def minilm_sentence(n_tokens: int) -> str:
    """A sentence of exactly ``n_tokens`` MiniLM tokens ([CLS] and [SEP] included): common one-piece words."""
    words = "the cat sat on the mat and the dog ran to the park while we sang".split()
    return " ".join(words[i % len(words)] for i in range(n_tokens - 2))


# ---------------------------------------------------------------------------------------------
# The browser


@contextlib.contextmanager
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Counter:
    """Bytes the server sends over the page's websockets."""

    def __init__(self, page):
        self.received = 0
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))

    def _frame(self, payload) -> None:
        self.received += len(payload)


def wait_idle(page, timeout_ms: int = 120_000) -> None:
    page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']", timeout=timeout_ms)


DRAWN = """([selector, text]) => {
  const texts = Array.isArray(text) ? text : [text];
  const plot = [...document.querySelectorAll('.js-plotly-plot')].find(p => texts.every(t => p.textContent.includes(t)));
  const node = plot && plot.querySelector(selector);
  return !!node && !!(node.getAttribute('href') || node.getAttribute('xlink:href'));
}"""
FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"


PROBLEMS = "[data-testid='stException'], [data-testid='stAlertContentError']"


def wait_drawn(page, selector: str, text: str | list[str], timeout_s: float = 120) -> None:
    """Until a plot whose text holds ``text`` (every one of a list) has ``selector`` drawn, the script is
    idle, and two frames passed.

    An exception or an error message on the page ends the wait at once, with what it says.
    """
    deadline = time.perf_counter() + timeout_s
    while not page.evaluate(DRAWN, [selector, text]):
        if page.locator(PROBLEMS).count():
            raise RuntimeError(f"the page shows a problem: {page.locator(PROBLEMS).first.inner_text()[:300]}")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"nothing with {selector!r} and {text!r} was drawn within {timeout_s:.0f} s")
        page.wait_for_timeout(20)
    wait_idle(page)
    page.evaluate(FRAMES)


def click_radio(page, label: str) -> None:
    page.locator("[data-testid='stRadio'] label").filter(has_text=label).first.click()


def measure_view(chromium, url: str, selector: str, drawn_text: str, click: str, after_text: str) -> dict:
    """Open ``url`` (cold), then click the radio option ``click`` and measure until ``after_text`` is drawn."""
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    counter = Counter(page)
    try:
        start = time.perf_counter()
        page.goto(url)
        wait_drawn(page, selector, drawn_text)
        cold = time.perf_counter() - start
        counter.received = 0
        start = time.perf_counter()
        click_radio(page, click)
        wait_drawn(page, selector, after_text)
        return {"bytes": counter.received, "seconds": time.perf_counter() - start, "cold": cold}
    finally:
        page.close()


ZOOM_TITLE = """(text) => [...document.querySelectorAll('.js-plotly-plot .gtitle')]
  .map(t => t.textContent).find(t => t.includes(text))"""


def drag_box(page, texts: list[str], n: int, rows: tuple[int, int], cols: tuple[int, int]) -> None:
    """Drag a box on the plot whose text holds ``texts``, from cell (rows[0], cols[0]) to (rows[1], cols[1])
    of an n x n map drawn over the whole plot area, as a person does with the mouse; the button stays down
    (releasing it is the request)."""
    plot = next(p for p in page.locator(".js-plotly-plot").all() if all(t in p.text_content() for t in texts))
    plot.scroll_into_view_if_needed()
    area = plot.locator(".nsewdrag").first.bounding_box()

    def at(row: float, col: float) -> tuple[float, float]:
        return area["x"] + (col + 0.5) / n * area["width"], area["y"] + (row + 0.5) / n * area["height"]

    page.mouse.move(*at(rows[0], cols[0]))
    page.mouse.down()
    page.mouse.move(*at(rows[1], cols[1]), steps=5)


def measure_long(chromium, url: str, n: int, layer: int, head: int) -> dict:
    """One head of an n-token language model, tile by tile: open ``url`` (cold: the model runs), then
    the next head's first picture (its overview computed from its queries and keys and drawn), then a
    box of about 120 x 120 positions dragged on it, from the button's release until its exact heatmap is
    drawn."""
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    counter = Counter(page)
    overview = f"queries 0-{n - 1}, keys 0-{n - 1}"
    try:
        start = time.perf_counter()
        page.goto(url)
        wait_drawn(page, ".im image", [f"layer {layer}, head {head}", overview], timeout_s=300)
        result = {"cold": time.perf_counter() - start, "cold_bytes": counter.received}
        counter.received = 0
        start = time.perf_counter()
        page.get_by_role("button", name="Next head").click()
        wait_drawn(page, ".im image", [f"layer {layer}, head {head + 1}", overview])
        result |= {"first": time.perf_counter() - start, "first_bytes": counter.received}
        middle = n // 2
        before = page.evaluate(ZOOM_TITLE, f"head {head + 1}: queries")  # the zoom's first region
        drag_box(page, [f"head {head + 1}", overview], n, (middle, middle + 119), (middle - 200, middle - 81))
        counter.received = 0
        start = time.perf_counter()
        page.mouse.up()  # the box is released: the zoom is asked for
        # While the page redraws, the zoom's plot may be gone for a moment (no title: None), which is no new region
        while (title := page.evaluate(ZOOM_TITLE, f"head {head + 1}: queries")) in (before, None):
            if time.perf_counter() - start > 120:
                raise TimeoutError("the dragged box did not change the zoom within 120 s")
            page.wait_for_timeout(20)
        wait_drawn(page, ".hm image", [title])
        result |= {"zoom": time.perf_counter() - start, "zoom_bytes": counter.received}
        result["region"] = title.split(": ", 1)[1]
        return result
    finally:
        page.close()


def explorer_url(port: int, params: dict[str, str]) -> str:
    return f"http://127.0.0.1:{port}/explorer?" + urllib.parse.urlencode(params)


# ---------------------------------------------------------------------------------------------
# The throwaway page of the three ways to draw one head

VARIANTS_PAGE = textwrap.dedent(
    '''
    """bench_render's throwaway page: one 1024 x 1024 head drawn three ways."""
    import numpy as np
    import streamlit as st

    from attnviz.figures.attention import attention_heatmap
    from attnviz.figures.images import attention_image, colour_indices, contrast_values, png_data_uri

    N = int(st.query_params.get("n", "1024"))
    CANVAS = st.components.v2.component(
        "bench_canvas",
        html="<canvas></canvas>",
        js="""
    export default function({data, parentElement}) {
      const canvas = parentElement.querySelector('canvas');
      canvas.dataset.drawn = '0';
      const img = new Image();
      img.onload = () => {
        canvas.width = img.width; canvas.height = img.height;
        canvas.style.width = '100%';
        canvas.style.imageRendering = 'pixelated';
        canvas.getContext('2d').drawImage(img, 0, 0);
        canvas.dataset.title = data.title;
        canvas.dataset.drawn = '1';
      };
      img.src = data.src;
    }
    """,
    )


    @st.cache_resource
    def head():
        rng = np.random.default_rng(0)
        w = rng.random((N, N)) ** 20
        return (w / w.sum(-1, keepdims=True)).astype(np.float32)


    @st.cache_resource
    def figure(variant):
        tokens = [f"t{i}" for i in range(N)]
        if variant == "heatmap":
            return attention_heatmap(head(), tokens, tokens, "encoder", "variant heatmap")
        return attention_image(head(), tokens, tokens, "encoder", title="variant image")


    variant = st.radio("variant", ["none", "heatmap", "image", "canvas"], horizontal=True, key="variant")
    if variant == "canvas":
        src = png_data_uri(colour_indices(contrast_values(head(), "linear")), "Blues")
        CANVAS(data={"src": src, "title": "variant canvas"}, key="canvas")
    elif variant != "none":
        st.plotly_chart(figure(variant), width="stretch")
    '''
)


def measure_variants(chromium, port: int, n: int) -> dict[str, dict]:
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    counter = Counter(page)
    results = {}
    try:
        page.goto(f"http://127.0.0.1:{port}/?n={n}")
        wait_idle(page)
        for variant, selector in (("heatmap", ".hm image"), ("image", ".im image")):
            click_radio(page, "none")
            wait_idle(page)
            counter.received = 0
            start = time.perf_counter()
            click_radio(page, variant)
            wait_drawn(page, selector, f"variant {variant}")
            results[variant] = {"bytes": counter.received, "seconds": time.perf_counter() - start}
        click_radio(page, "none")
        wait_idle(page)
        counter.received = 0
        start = time.perf_counter()
        click_radio(page, "canvas")
        page.wait_for_selector("canvas[data-drawn='1']", timeout=120_000)  # inside the component's shadow root
        wait_idle(page)
        page.evaluate(FRAMES)
        results["canvas"] = {"bytes": counter.received, "seconds": time.perf_counter() - start}
    finally:
        page.close()
    return results


@contextlib.contextmanager
def variants_server() -> Iterator[int]:
    """A server of the throwaway variants page (a temporary app folder with the repository's config)."""
    import shutil
    import subprocess

    from bench_class import free_port, stop, wait_healthy

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / ".streamlit", Path(tmp) / ".streamlit")
        (Path(tmp) / "variants.py").write_text(VARIANTS_PAGE)
        port = free_port()
        cmd = [sys.executable, "-m", "streamlit", "run", "variants.py", "--server.headless", "true"]
        cmd += ["--server.address", "127.0.0.1", "--server.port", str(port), "--server.fileWatcherType", "none"]
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(port, proc)
            yield port
        finally:
            stop(proc)


# ---------------------------------------------------------------------------------------------


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "MISS"


def print_long(result: dict, n: int) -> None:
    (first_mb, first_s), (_, zoom_s) = LONG_TARGETS["first"], LONG_TARGETS["zoom"]
    mb = result["first_bytes"] / 1e6
    print(f"\n  one head of a language model at {n} tokens, tile by tile (random Llama layout, 2 layers, d_head 64)")
    print(f"  {'step':54} {'MB':>7} {'s':>8}  verdicts (targets)")
    print(f"  {'opening the link (cold: the model runs, then layer 1)':54} {result['cold_bytes'] / 1e6:7.3f} "
          f"{result['cold']:8.2f}  (for information)")  # fmt: skip
    verdicts = f"{verdict(mb, first_mb)} (<= {first_mb} MB) {verdict(result['first'], first_s)} (<= {first_s} s)"
    print(f"  {'first picture of a head (next head: its overview)':54} {mb:7.3f} {result['first']:8.2f}  {verdicts}")
    zoom = f"zoom: a box dragged, {result['region']}"
    print(f"  {zoom:54} {result['zoom_bytes'] / 1e6:7.3f} {result['zoom']:8.2f}  "
          f"{verdict(result['zoom'], zoom_s)} (<= {zoom_s} s)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default="one,grid,long,variants")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    # --quick keeps the one head above the explorer's exact-heatmap limit (128), so that it is still an image
    one_n, grid_n, variants_n = (160, 40, 64) if args.quick else (1024, 512, 1024)
    long_n = 3000 if args.quick else 8192  # both over ATTNVIZ_FULL_MAPS_MB's 256 MB: tile by tile
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    from attnviz.checkpoints.bert import minilm_dir

    print(f"attnviz render benchmark | {cpu_name()}, {os.cpu_count()} cores | python {platform.python_version()}")
    print("a shared machine: other work may slow any figure; compare rows of one run, and re-measure")
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp)
        build_random_model(models / "long", max_len=max(one_n, grid_n) + 64)
        if "long" in only:  # d_head 64, as GPT-2's and SmolLM2's: what one head's tiles cost
            build_random_lm(models / "long-lm", max_len=long_n, d_model=256, n_heads=4)
        roots, grid_model = [str(models)], "MiniLM"
        if minilm_dir() is None:
            build_random_model(models / "minilm-shaped", max_len=grid_n + 8, n_layers=6, n_heads=12, d_model=96)
            grid_model = "random, MiniLM's shape; MiniLM is not installed"
        else:
            roots.append(str(minilm_dir()))  # opened by its path, as a visitor would
        os.environ["ATTNVIZ_MODEL_ROOTS"] = os.pathsep.join(roots)
        rows = []
        # No file watcher: nothing to reload here, and watching a .venv/ in the repository costs CPU.
        with app_server("--server.fileWatcherType", "none") as (port, _), browser() as chromium:
            views = []  # (name, query parameters, target)
            if "one" in only:
                params = {"model": CUSTOM_PATH, "model_path": "long", "src": letters(one_n - 1), "kind": "encoder"}
                params |= {"view": "One head"}
                views.append((f"one head, {one_n} tokens (random model)", params, TARGETS["one head"]))
            if "grid" in only:
                if grid_model == "MiniLM":
                    params = {"model": CUSTOM_PATH, "model_path": str(minilm_dir()), "src": minilm_sentence(grid_n)}
                else:
                    params = {"model": CUSTOM_PATH, "model_path": "minilm-shaped", "src": letters(grid_n - 1)}
                params |= {"kind": "encoder", "view": "All heads (model view)"}
                views.append((f"grid 6 x 12, {grid_n} tokens ({grid_model})", params, TARGETS["grid"]))
            for name, params, target in views:
                url = explorer_url(port, params | {"contrast": "linear"})
                result = measure_view(
                    chromium, url, ".im image", "contrast: linear", "logarithmic", "contrast: logarithmic"
                )
                rows.append((name, result, target))
            long = None
            if "long" in only:
                params = {"model": CUSTOM_PATH, "model_path": "long-lm", "src": letters(long_n - 1), "view": "One head"}
                long = measure_long(chromium, explorer_url(port, params | {"layer": "1", "head": "1"}), long_n, 1, 1)
        print(f"\n  {'view':54} {'MB':>7} {'drawn s':>8} {'cold s':>7}  verdicts (targets)")
        for name, result, (mb_target, s_target) in rows:
            mb = result["bytes"] / 1e6
            print(
                f"  {name:54} {mb:7.3f} {result['seconds']:8.2f} {result['cold']:7.2f}  "
                f"{verdict(mb, mb_target)} (<= {mb_target} MB) {verdict(result['seconds'], s_target)} (<= {s_target} s)"
            )
        if long is not None:
            print_long(long, long_n)
    if "variants" in only:
        with variants_server() as port, browser() as chromium:
            results = measure_variants(chromium, port, variants_n)
        print(f"\n  one head of {variants_n} x {variants_n}, three ways to draw it (the same run, the same machine)")
        print(f"  {'variant':54} {'MB':>7} {'drawn s':>8}")
        names = {
            "heatmap": "plotly heatmap of float32 numbers (before)",
            "image": "plotly Image trace of a palette PNG (attnviz now)",
            "canvas": "bare canvas component, same PNG (no axes or zoom)",
        }
        for variant, result in results.items():
            print(f"  {names[variant]:54} {result['bytes'] / 1e6:7.3f} {result['seconds']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
