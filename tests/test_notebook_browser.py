"""The notebook views in real front ends: nbclient and nbconvert on the quickstart, JupyterLab, marimo,
and the self-contained HTML mode, in chromium.

One JupyterLab server and one notebook serve every JupyterLab test (each view in a cell of its own);
one browser serves the module. Every server listens on 127.0.0.1 and is stopped by its process id;
every request the browser makes is recorded, and one to any other host fails the test. Waits are
for what is asserted (the view's ``data-drawn`` counter, ``data-frame``, ``data-step``), never fixed
sleeps. What the browser shows is compared with what Python computed for the same choice.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import urlopen

import pytest

pytest.importorskip("anywidget")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "notebooks" / "quickstart.ipynb"
CHROMIUM = Path("/usr/bin/chromium")
START_S = 120  # a server's start and a kernel's first run, on two busy cores


WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart notebook run by nbclient (which keeps the widgets' state in the notebook), and its folder."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    folder = tmp_path_factory.mktemp("quickstart")
    nb = nbformat.read(QUICKSTART, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(folder)}}).execute()
    return nb, folder


def test_the_quickstart_notebook_runs_every_view(quickstart):
    nb, folder = quickstart
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    widgets = [o for o in outputs if WIDGET in o.get("data", {})]
    assert len(widgets) >= 6
    stills = [o for o in outputs if o.get("data", {}).get("text/html", "").startswith('<div class="attnviz-fallback"')]
    assert len(stills) == len(widgets)  # each view's still picture, an output of its own
    assert all("image/png" in o["data"] and "<img" in o["data"]["text/html"] for o in stills)
    assert (folder / "head.svg").is_file() and (folder / "head.html").is_file()
    assert "widgets" in nb.metadata  # nbclient kept the widget state: nbconvert then draws widget outputs its way


def test_nbconvert_of_the_run_notebook_shows_the_still_pictures_offline(quickstart, browser, tmp_path):
    """nbconvert renders a widget whose state the notebook keeps through a widget manager from a CDN: blank
    offline. Each view's still picture is an output of its own, and shows."""
    from nbconvert import HTMLExporter

    nb, _ = quickstart
    body, _ = HTMLExporter().from_notebook_node(nb)
    page_file = tmp_path / "quickstart.html"
    page_file.write_text(body, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.route(re.compile(r"^https?://"), lambda route: route.abort())  # offline: every CDN fails
    page.goto(page_file.as_uri(), wait_until="load")
    views = sum(WIDGET in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    stills = page.locator(".attnviz-fallback img")
    assert stills.count() == views
    for i in range(views):
        still = stills.nth(i)
        still.scroll_into_view_if_needed()
        assert still.is_visible()
        assert still.evaluate("img => img.complete && img.naturalWidth >= 320")  # the PNG decoded, at its size
    assert page.locator(".attnviz-view").count() == 0  # no widget drew: what shows is the still
    page.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server stopped: exit {proc.returncode}")
        try:
            with urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.3)  # polling a server's start, not waiting for a drawing
    raise AssertionError(f"{url} did not answer in {START_S} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright
    from test_browser import CHROMIUM_ARGS

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _recording(page) -> list[str]:
    """Every URL the page requests; the test fails on any host but 127.0.0.1."""
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    return seen


def _outside(urls: list[str]) -> list[str]:
    return [
        u for u in urls if urlparse(u).scheme not in ("data", "blob", "about") and urlparse(u).hostname != "127.0.0.1"
    ]


def _frame(panel) -> str:
    return panel.get_attribute("data-frame") or ""


def _wait_frame_change(page, selector: str, index: int, before: str) -> str:
    """The panel's next frame (locators pierce marimo's shadow DOM, where page scripts do not)."""
    from playwright.sync_api import expect

    panel = page.locator(selector).nth(index)
    expect(panel).not_to_have_attribute("data-frame", before, timeout=START_S * 1000)
    expect(panel).to_have_attribute("data-frame", re.compile(".+"), timeout=START_S * 1000)
    return _frame(panel)


def _check_head_view(page, selector: str, index: int, artifacts: Path, name: str) -> None:
    """Hover a token and a cell, change the layer: the highlight and the frame follow."""
    from playwright.sync_api import expect

    panel = page.locator(selector).nth(index)
    expect(panel).to_have_attribute("data-frame", re.compile(".+"), timeout=START_S * 1000)
    assert panel.get_attribute("data-hover-row") in (None, "-1")
    label = panel.locator(".attnviz-rows .attnviz-label").nth(2)
    label.hover()
    expect(panel).to_have_attribute("data-hover-row", "2")
    expect(label).to_have_class(re.compile("attnviz-on"))
    box = panel.locator(".attnviz-overlay").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] * 0.9)
    expect(panel).to_have_attribute("data-hover-col", re.compile(r"^[0-9]+$"))
    before = _frame(panel)
    panel.locator("select[aria-label='Layer']").select_option("2")
    after = _wait_frame_change(page, selector, index, before)
    assert after.split("|")[1] == "2" and before.split("|")[1] == "1"
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)


def _drag_zoom(page, selector: str, index: int) -> str:
    """Drag a box on a long map's overview; the frame that comes back is the exact region."""
    panel = page.locator(selector).nth(index)
    panel.scroll_into_view_if_needed()
    before = _frame(panel)
    box = panel.locator(".attnviz-overlay").bounding_box()
    x, y = box["x"] + min(box["width"], 600) * 0.50, box["y"] + min(box["height"], 600) * 0.50
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 6, y + 6, steps=4)
    page.mouse.up()
    return _wait_frame_change(page, selector, index, before)


SENTENCES = ["the cat sat on the mat", "a dog runs in the park"]
STEP_TEXT = "the cat sat on the mat"

NOTEBOOK_CELLS = [  # one view per cell; the tests find each by its cell
    """
    import numpy as np
    from attnviz.notebook import atlas_view, head_view, model_view, step_view
    from attnviz.tiles import TiledAttention
    rng = np.random.default_rng(0)
    T = 12
    scores = np.where(np.tril(np.ones((T, T), bool)), rng.normal(size=(2, 1, 3, T, T)), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    attentions = tuple(w / w.sum(-1, keepdims=True) for w in weights)
    head_view(attentions, tokens=[f"tok{i}" for i in range(T)], mode="widget")
    """,
    """
    L, H, N, D = 1, 2, 8192, 16
    q = rng.normal(size=(L, H, N, D)).astype(np.float32) * 2
    k = rng.normal(size=(L, H, N, D)).astype(np.float32)
    tiled = TiledAttention({"decoder": q}, {"decoder": k}, None, tuple(f"w{i}" for i in range(N)), {})
    head_view(tiled, dtype="float16", mode="widget")
    """,
    """
    model_view(attentions, tokens=[f"tok{i}" for i in range(T)], mode="widget")
    """,
    f"""
    import attnviz
    model = attnviz.load("en-de")
    step_view(model, {STEP_TEXT!r}, mode="widget")
    """,
    f"""
    atlas_view(attnviz.compute_atlas(model, {SENTENCES!r}), mode="widget")
    """,
]
HEAD, LONG, MODEL, STEP, ATLAS = range(5)  # the cells


def _notebook(folder: Path) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "views.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def artifacts() -> Path:
    folder = ROOT / "test-artifacts"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):
    """JupyterLab on 127.0.0.1 with every cell of the notebook run in chromium: (page, requests seen)."""
    pytest.importorskip("jupyterlab")
    folder = tmp_path_factory.mktemp("lab")
    _notebook(folder)
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder / "config"), "JUPYTER_RUNTIME_DIR": str(folder / "rt")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--allow-root",
            "--no-browser",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--ServerApp.root_dir",
            str(folder),
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api", proc)
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        seen = _recording(page)
        page.goto(f"http://127.0.0.1:{port}/lab/tree/views.ipynb?reset")
        page.get_by_text("| Idle").first.wait_for(timeout=START_S * 1000)
        page.locator(".jp-Notebook .jp-Cell").first.click()
        for _ in NOTEBOOK_CELLS:
            page.keyboard.press("Shift+Enter")
        for i in range(len(NOTEBOOK_CELLS)):
            _cell(page, i).locator(".attnviz-view[data-ready='1']").wait_for(timeout=START_S * 1000)
        yield page, seen
        page.close()
    finally:
        _stop(proc)


def _cell(page, index: int):
    return page.locator(".jp-Notebook .jp-CodeCell").nth(index)


def test_jupyterlab_draws_the_head_view_and_hides_its_still(lab, artifacts):
    page, _ = lab
    panels = ".jp-OutputArea-output .attnviz-head"
    _check_head_view(page, panels, 0, artifacts, "notebook-jupyterlab-head")
    still = _cell(page, HEAD).locator(".attnviz-fallback")
    assert still.count() == 1 and not still.is_visible()  # the view is drawn: its still picture is hidden


def test_jupyterlab_opens_an_8192_token_overview_then_zooms(lab, artifacts):
    page, _ = lab
    panels = ".jp-OutputArea-output .attnviz-head"
    overview = _wait_frame_change(page, panels, LONG, "")
    assert overview.endswith("|0,8192,0,8192|8x8"), overview  # 8192 tokens, max-pooled to 1024 pixels
    zoomed = _drag_zoom(page, panels, LONG)
    assert zoomed.endswith("|1x1"), zoomed  # a small box: exact weights
    page.screenshot(path=str(artifacts / "notebook-jupyterlab-long.png"))


def _click_thumbnail(page, model_panel, layer: int, head: int) -> None:
    """Click the middle of head ``head`` of layer ``layer`` (from 1) on the model view's thumbnails."""
    canvas = model_panel.locator(".attnviz-thumbs")
    canvas.scroll_into_view_if_needed()
    left, top, width, height, gap = (float(v) for v in canvas.get_attribute("data-layout").split(","))
    x = left + (head - 1) * (width + gap) + width / 2  # canvas pixels
    y = top + (layer - 1) * (height + gap) + height / 2
    size = canvas.evaluate("c => [c.width, c.height]")
    box = canvas.bounding_box()
    page.mouse.click(box["x"] + x * box["width"] / size[0], box["y"] + y * box["height"] / size[1])


def test_jupyterlab_a_click_on_a_head_in_the_model_view_opens_it(lab, artifacts):
    from playwright.sync_api import expect

    page, _ = lab
    cell = _cell(page, MODEL)
    head_panel = cell.locator(".attnviz-head")
    expect(head_panel).to_have_attribute("data-frame", re.compile(r"^decoder\|1\|1\|"), timeout=START_S * 1000)
    _click_thumbnail(page, cell.locator(".attnviz-model"), layer=2, head=3)
    expect(head_panel).to_have_attribute("data-frame", re.compile(r"^decoder\|2\|3\|"), timeout=START_S * 1000)
    expect(head_panel.locator("select[aria-label='Head']")).to_have_value("3")
    page.screenshot(path=str(artifacts / "notebook-jupyterlab-model.png"))


@pytest.fixture(scope="module")
def shipped():
    """The shipped en-de model, its step view's numbers and its atlas, computed here as in the notebook."""
    import attnviz
    from attnviz.notebook import atlas_view, step_view

    model = attnviz.load("en-de")
    return step_view(model, STEP_TEXT, mode="widget"), atlas_view(
        attnviz.compute_atlas(model, SENTENCES), mode="widget"
    )


def _chip_weights(box) -> list[float]:
    return [
        float(t.rsplit(": ", 1)[1]) for t in box.locator(".attnviz-chip").evaluate_all("cs => cs.map(c => c.title)")
    ]


def test_jupyterlab_step_view_steps_and_shows_each_steps_rows(lab, shipped, artifacts):
    import numpy as np
    from playwright.sync_api import expect

    page, _ = lab
    spec = shipped[0].spec
    n, L, H, S = spec["n_steps"], spec["n_layers"], spec["n_heads"], len(spec["src"])
    cross = np.frombuffer(shipped[0].cross_rows, dtype=np.float32).reshape(n, L, H, S)
    panel = _cell(page, STEP).locator(".attnviz-step")
    panel.scroll_into_view_if_needed()
    expect(panel).to_have_attribute("data-step", "0", timeout=START_S * 1000)
    next_step = panel.get_by_role("button", name="step ▶")
    for step in (1, 2):
        next_step.click()
        expect(panel).to_have_attribute("data-step", str(step))
        title = panel.locator(".attnviz-title").first
        expect(title).to_contain_text(f"step {step + 1} of {n}: writes {spec['written'][step]}")
        chips = panel.locator(".attnviz-chips").first  # cross-attention over the source
        np.testing.assert_allclose(_chip_weights(chips), cross[step, L - 1, 0], atol=5e-5)  # the last layer, head 1
    panel.locator("select[aria-label='Layer']").select_option("1")
    panel.locator("select[aria-label='Head']").select_option("2")
    expect(panel).to_have_attribute("data-step", "2")
    np.testing.assert_allclose(_chip_weights(panel.locator(".attnviz-chips").first), cross[2, 0, 1], atol=5e-5)
    page.screenshot(path=str(artifacts / "notebook-jupyterlab-step.png"))


def test_jupyterlab_atlas_view_draws_the_head_map_and_the_table(lab, shipped, artifacts):
    from playwright.sync_api import expect

    page, _ = lab
    spec = shipped[1].spec
    kind, statistic = spec["kinds"][0], spec["statistics"][1]
    heads = len(spec["atlas"][kind]["layer"])
    panel = _cell(page, ATLAS).locator(".attnviz-atlas")
    panel.scroll_into_view_if_needed()
    expect(panel.locator("svg circle")).to_have_count(heads, timeout=START_S * 1000)
    expect(panel.locator(".attnviz-table tr")).to_have_count(heads + 1)  # the header and one row a head
    panel.locator("select[aria-label='Colour']").select_option(statistic)
    values = spec["atlas"][kind]["statistics"][statistic]["values"]
    top = max(v for v in values if v is not None)
    first = panel.locator(".attnviz-table tr").nth(1)
    expect(first.locator("td").nth(2)).to_have_text(f"{top:.4f}")  # sorted by the statistic chosen
    first.click()
    expect(first).to_have_class(re.compile("attnviz-on"))
    at = values.index(top)
    dot = panel.locator("svg circle").nth(at)
    expect(dot).to_have_attribute("stroke", "#d62728")  # the head picked in the table, marked on the map
    page.screenshot(path=str(artifacts / "notebook-jupyterlab-atlas.png"))


def test_jupyterlab_no_request_left_127_0_0_1(lab):
    _, seen = lab
    assert seen and not _outside(seen), f"requests left 127.0.0.1: {_outside(seen)[:5]}"


MARIMO_APP = """
import marimo

app = marimo.App()


@app.cell
def _():
    import numpy as np
    from attnviz.notebook import head_view

    rng = np.random.default_rng(0)
    T = 10
    scores = np.where(np.tril(np.ones((T, T), bool)), rng.normal(size=(2, 1, 3, T, T)), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    attentions = tuple(w / w.sum(-1, keepdims=True) for w in weights)
    view = head_view(attentions, tokens=[f"tok{i}" for i in range(T)], mode="widget")
    view
    return


if __name__ == "__main__":
    app.run()
"""


def test_marimo_runs_the_head_view_and_it_reacts(browser, tmp_path):
    pytest.importorskip("marimo")
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    app = tmp_path / "views_app.py"
    app.write_text(MARIMO_APP)
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marimo",
            "run",
            str(app),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--headless",
            "--no-token",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        seen = _recording(page)
        page.goto(f"http://127.0.0.1:{port}/")
        _check_head_view(page, ".attnviz-head", 0, artifacts, "notebook-marimo-head")
        assert not _outside(seen), f"requests left 127.0.0.1: {_outside(seen)[:5]}"
        page.close()
    finally:
        _stop(proc)


# ---------------------------------------------------------------------------------------------
# The self-contained HTML mode: an iframe's srcdoc, no widget manager, no kernel


@pytest.fixture
def html_page(browser):
    """A page with nothing but what the notebook shows in HTML mode, and every request recorded."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    seen = _recording(page)
    yield page, seen
    page.close()


def _show_html_mode(page, view) -> object:
    """Put ``view``'s HTML-mode output (the iframe) in ``page``; the iframe's frame, once its view is drawn."""
    html = view._repr_mimebundle_()["text/html"]
    assert view.mode == "html" and html.startswith("<iframe srcdoc=")
    page.set_content(f"<!DOCTYPE html><html><body>{html}</body></html>")
    frame = page.frame_locator("iframe")
    frame.locator(".attnviz-view[data-ready='1']").wait_for(timeout=60_000)
    return frame


def _hover_cell(overlay, shape: tuple[int, int], i: int, j: int, at=(0.5, 0.5)) -> None:
    """Rest the pointer on cell (i, j) of a map of ``shape`` cells, at ``at`` (row, column) of the cell.

    The map's own hover, not a bare mouse move: playwright first waits until the map is stable (the same
    box over two animation frames) and is what the frame finds at that point. Right after a view was
    drawn, in a full run on two busy cores, a bare move was once never seen by the map.
    """
    box, (h, w) = overlay.bounding_box(), shape
    overlay.hover(position={"x": (j + at[1]) * box["width"] / w, "y": (i + at[0]) * box["height"] / h})


def _tip(panel) -> str:
    return panel.locator(".attnviz-tip").inner_text()


def test_html_mode_renders_with_hover_and_pickers_and_no_widget_manager(html_page):
    import numpy as np
    from playwright.sync_api import expect
    from test_notebook import hf_attentions

    from attnviz.notebook import head_view

    page, seen = html_page
    attentions = hf_attentions(layers=2, heads=3, T=9)
    tokens = [f"tok{i}" for i in range(9)]
    view = head_view(attentions, tokens=tokens, mode="html")
    frame = _show_html_mode(page, view)
    panel = frame.locator(".attnviz-head")
    expect(panel).to_have_attribute("data-frame", re.compile(r"^decoder\|1\|1\|linear\|"))
    no_manager = frame.locator("body").evaluate(
        "b => typeof window.require === 'undefined' && typeof window.define === 'undefined'"
        " && !document.querySelector('script[src]') && !document.querySelector('link[href]')"
    )
    assert no_manager  # no require.js, no widget manager, nothing loaded from anywhere
    overlay = panel.locator(".attnviz-overlay")
    _hover_cell(overlay, (9, 9), 6, 2)
    expect(panel).to_have_attribute("data-tip", "6,2")
    assert f"weight: {attentions[0][0, 0, 6, 2]:.4f}" in _tip(panel)
    assert panel.locator(".attnviz-rows .attnviz-label").nth(6).get_attribute("class").endswith("attnviz-on")
    panel.locator("select[aria-label='Layer']").select_option("2")
    panel.locator("select[aria-label='Head']").select_option("3")
    expect(panel).to_have_attribute("data-frame", re.compile(r"^decoder\|2\|3\|linear\|"))
    _hover_cell(overlay, (9, 9), 8, 5)
    expect(panel).to_have_attribute("data-tip", "8,5")
    assert f"weight: {attentions[1][0, 2, 8, 5]:.4f}" in _tip(panel)
    panel.locator("select[aria-label='Contrast']").select_option("row")
    expect(panel).to_have_attribute("data-frame", re.compile(r"^decoder\|2\|3\|row\|"))
    python = head_view(attentions, tokens=tokens, layer=2, head=3, contrast="row", mode="widget")
    drawn = panel.locator(".attnviz-map").evaluate(
        "(c, n) => { const s = c.width / n, d = c.getContext('2d'); const out = [];"
        " for (let i = 0; i < n; i++) for (let j = 0; j < n; j++)"
        " out.push(Array.from(d.getImageData(j * s + s / 2, i * s + s / 2, 1, 1).data.slice(0, 3)));"
        " return out; }",
        9,
    )
    from attnviz.figures.common import WEIGHT_COLORSCALE
    from attnviz.figures.images import palette

    indices = np.frombuffer(python.indices, dtype=np.uint8).reshape(9, 9)
    np.testing.assert_array_equal(np.array(drawn).reshape(9, 9, 3), palette(WEIGHT_COLORSCALE)[indices])
    assert [u for u in seen if not u.startswith(("about:", "data:"))] == []  # not one request


def test_html_mode_a_choice_the_page_does_not_hold_is_put_back_and_the_next_one_it_holds_is_drawn(
    html_page, monkeypatch
):
    """A page over its size budget holds some heads alone. A refused head had stayed in the page's state and its
    picker: the pickers named a head the map did not show, and every later choice, one the page holds included,
    was refused with it."""
    import numpy as np
    from playwright.sync_api import expect

    from attnviz.notebook import head_view, standalone

    page, _ = html_page
    maps = np.random.default_rng(0).random((1, 4, 60, 60)).astype(np.float32)
    maps /= maps.sum(-1, keepdims=True)
    monkeypatch.setattr(standalone, "PAGE_BUDGET", 2**16)  # head 1 under its three contrasts: 60 x 60 each
    view = head_view(maps, tokens=[f"w{i}" for i in range(60)], kind="encoder", mode="html")
    assert sorted(view.frames_for_page()["head"]) == [f"encoder|1|1|{c}|0" for c in ("linear", "log", "row")]
    frame = _show_html_mode(page, view)
    panel = frame.locator(".attnviz-head")
    expect(panel).to_have_attribute("data-frame", re.compile(r"^encoder\|1\|1\|linear\|"))
    head = panel.locator("select[aria-label='Head']")
    head.select_option("2")
    expect(panel.locator(".attnviz-error")).to_contain_text("This choice is not saved in this page")
    expect(head).to_have_value("1")  # the picker names the head the map shows
    panel.locator("select[aria-label='Contrast']").select_option("log")
    expect(panel).to_have_attribute("data-frame", re.compile(r"^encoder\|1\|1\|log\|"))
    expect(panel.locator(".attnviz-error")).to_have_text("")


def test_the_lines_view_cuts_a_long_label_by_character_not_inside_an_emoji(html_page):
    """The lines view cuts labels at 18 characters; counted in UTF-16 units, it had cut an emoji in half and drawn
    its lone surrogate as a replacement character."""
    import numpy as np
    from playwright.sync_api import expect

    from attnviz.notebook import head_view

    page, _ = html_page
    tokens = ["a" * 17 + "\N{GRINNING FACE}" + "tail", "b"]
    view = head_view(np.full((1, 1, 2, 2), 0.5, np.float32), tokens=tokens, kind="encoder", mode="html")
    frame = _show_html_mode(page, view)
    panel = frame.locator(".attnviz-head")
    panel.evaluate(  # what the canvases are asked to draw from now on: a hover draws the lines again
        "() => { window.drawnText = []; const fill = CanvasRenderingContext2D.prototype.fillText;"
        " CanvasRenderingContext2D.prototype.fillText = function (t, ...a) { window.drawnText.push(String(t));"
        " return fill.call(this, t, ...a); }; }"
    )
    _hover_cell(panel.locator(".attnviz-overlay"), (2, 2), 1, 0)
    expect(panel).to_have_attribute("data-tip", "1,0")
    drawn = panel.evaluate("() => window.drawnText")
    assert "a" * 17 + "\N{GRINNING FACE}" in drawn, drawn  # 18 characters: the emoji whole
    assert not any(0xD800 <= ord(c) <= 0xDFFF for text in drawn for c in text), drawn


def test_html_mode_model_view_click_opens_the_head(html_page):
    from playwright.sync_api import expect
    from test_notebook import hf_attentions

    from attnviz.notebook import model_view

    page, _ = html_page
    view = model_view(hf_attentions(layers=3, heads=2, T=7), tokens=list("abcdefg"), mode="html")
    frame = _show_html_mode(page, view)
    panel = frame.locator(".attnviz-head")
    expect(panel).to_have_attribute("data-frame", re.compile(r"^decoder\|1\|1\|"))
    _click_thumbnail(page, frame.locator(".attnviz-model"), layer=3, head=2)
    expect(panel).to_have_attribute("data-frame", re.compile(r"^decoder\|3\|2\|"))


def test_the_tooltip_names_the_cell_under_the_pointer_and_follows_a_redraw(html_page):
    """The tooltip's glitch: it kept the last frame's number when the view redrew under a resting pointer,
    and a cell the pointer had left at the map's edge."""
    from playwright.sync_api import expect
    from test_notebook import hf_attentions

    from attnviz.notebook import head_view

    page, _ = html_page
    T = 11
    attentions = hf_attentions(layers=2, heads=2, T=T, causal=False, seed=3)
    view = head_view(attentions, tokens=[f"t{i}" for i in range(T)], kind="encoder", mode="html")
    frame = _show_html_mode(page, view)
    panel = frame.locator(".attnviz-head")
    overlay = panel.locator(".attnviz-overlay")
    for i, j, at in [(0, 0, (0.12, 0.12)), (4, 7, (0.88, 0.88)), (10, 10, (0.88, 0.88)), (3, 10, (0.5, 0.9))]:
        _hover_cell(overlay, (T, T), i, j, at)
        expect(panel).to_have_attribute("data-tip", f"{i},{j}")
        assert f"query {i} t{i}\nkey {j} t{j}\n" in _tip(panel)
        assert f"weight: {attentions[0][0, 0, i, j]:.4f}" in _tip(panel)
    _hover_cell(overlay, (T, T), 5, 4)
    expect(panel).to_have_attribute("data-tip", "5,4")
    panel.locator("select[aria-label='Head']").select_option("2")  # the pointer rests on the map
    expect(panel).to_have_attribute("data-frame", re.compile(r"^encoder\|1\|2\|"))
    expect(panel.locator(".attnviz-tip")).to_contain_text(f"weight: {attentions[0][0, 1, 5, 4]:.4f}")
    box = overlay.bounding_box()
    page.mouse.move(box["x"] + box["width"] + 40, box["y"] + box["height"] / 2)  # off the map
    expect(panel.locator(".attnviz-tip")).to_be_hidden()
    expect(panel).not_to_have_attribute("data-tip", re.compile("."))
