"""The app's downloads are bounded before they are built, and nothing a visitor leaves holds maps (issue 31).

A CSV of every head used to be a pandas long form (5.5 GB for a 2,000-token text); a closed tab's
session, which Streamlit keeps a while, held the maps through its download callables and its bound
widgets' ``format_func``. Here: the streamed CSV against the pandas long form and its size bound,
the refusal over ATTNVIZ_MAX_EXPORT_MB, what the callables and the session state reach, the memory
a 2,000-token CSV of every head takes (in a subprocess), and the closed-tabs benchmark's contract.
"""

from __future__ import annotations

import gc
import io
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import streamlit as st
from conftest import open_app
from streamlit.delta_generator import DeltaGenerator

from attnviz import analysis
from attnviz.export import AttentionExport
from attnviz.lessons import walkthrough as wk

ROOT = Path(__file__).resolve().parent.parent
TOKENS = ["a,b", 'say "hi"', "é", "line\nbreak", "x", "", "日本"]


def read(data: bytes) -> pd.DataFrame:
    return pd.read_csv(io.BytesIO(data), keep_default_na=False, dtype={"query_token": str, "key_token": str})


@pytest.mark.parametrize(
    "layers, heads, names",
    [(None, None, None), ([2], [3, 1], None), ([1, 2], None, None), ([2], [2], (["7"], ["mean"]))],
)
def test_streamed_csv_is_the_long_form_and_within_its_bound(layers, heads, names):
    rng = np.random.default_rng(0)
    maps = rng.random((2, 3, 5, 7)).astype(np.float32)
    maps[0, 0, 0, 0], maps[1, 2, 4, 6] = -3.25e-30, 1.5e30  # the widest values
    q_tokens, k_tokens = TOKENS[:5], TOKENS
    out = io.BytesIO()
    written = analysis.long_form_csv(out, maps, q_tokens, k_tokens, layers, heads, "score", names)
    data = out.getvalue()
    assert written == len(data)
    bound = analysis.long_form_csv_size(maps.shape, q_tokens, k_tokens, layers, heads, "score", names)
    assert len(data) <= bound <= 1.6 * len(data)
    got = read(data)
    want = analysis.long_form(maps, q_tokens, k_tokens, layers, heads).rename(columns={"weight": "score"})
    if names:
        want = want.assign(layer=int(names[0][0]), head=names[1][0])
    assert list(got.columns) == list(want.columns)
    np.testing.assert_array_equal(got["score"].to_numpy(np.float32), want["score"].to_numpy())  # float32 exactly
    for column in ("layer", "head", "query_index", "query_token", "key_index", "key_token"):
        assert got[column].astype(str).tolist() == want[column].astype(str).tolist(), column


def test_percent_signs_in_tokens_and_names_are_written_as_they_are():
    """A row is one %-format of its values: a label's "%" must not be read as a conversion."""
    rng = np.random.default_rng(2)
    maps = rng.random((1, 2, 3, 4)).astype(np.float32)
    q_tokens, k_tokens = ["50%", "%s", "%%"], ["%.9g", "a%", "%(x)s", "100 %,"]
    names = (["%d"], ["%", "mean%"])
    out = io.BytesIO()
    analysis.long_form_csv(out, maps, q_tokens, k_tokens, names=names)
    got = read(out.getvalue())
    want = analysis.long_form(maps, q_tokens, k_tokens).assign(layer="%d", head=np.repeat(["%", "mean%"], 3 * 4))
    np.testing.assert_array_equal(got["weight"].to_numpy(np.float32), want["weight"].to_numpy())
    for column in ("layer", "head", "query_index", "query_token", "key_index", "key_token"):
        assert got[column].astype(str).tolist() == want[column].astype(str).tolist(), column


def test_a_token_that_reads_as_a_formula_is_written_as_text():
    """A spreadsheet runs a cell that begins with = + - or @ (CSV injection): such a token, from a visitor's or
    a shared link's text, is written with a leading apostrophe; a lone - or + piece stays as it is."""
    maps = np.full((1, 1, 2, 5), 0.2, dtype=np.float32)
    keys = ['=HYPERLINK("http://x","y")', "@SUM(A1)", "+1", "-", "-2"]
    out = io.BytesIO()
    analysis.long_form_csv(out, maps, ["▁a", "\tb"], keys)
    assert len(out.getvalue()) <= analysis.long_form_csv_size(maps.shape, ["▁a", "\tb"], keys)
    got = read(out.getvalue())
    assert got["key_token"].tolist()[:5] == ['\'=HYPERLINK("http://x","y")', "'@SUM(A1)", "'+1", "-", "'-2"]
    assert set(got["query_token"]) == {"▁a", "'\tb"}
    text = wk.tensor_csv(np.zeros((1, 2, 1)), ("head", "source position", "d_k"), ["=1", "x"])
    assert pd.read_csv(io.StringIO(text))["token"].tolist() == ["'=1", "x"]


def test_the_csv_is_written_a_block_at_a_time(monkeypatch):
    monkeypatch.setattr(analysis, "CSV_BLOCK_ROWS", 10)
    sizes = []

    class Out(io.BytesIO):
        def write(self, b):
            sizes.append(len(b))
            return super().write(b)

    maps = np.full((1, 2, 30, 5), 0.2, dtype=np.float32)
    analysis.long_form_csv(Out(), maps, [str(i) for i in range(30)], list("abcde"))
    assert len(sizes) == 1 + 2 * 15, "a header, then 2 rows of 5 keys per block"
    assert max(sizes[1:]) < 300


def test_tensor_csv_streamed_and_bounded():
    rng = np.random.default_rng(1)
    tensor = rng.standard_normal((2, 4, 3)).astype(np.float32)
    labels = ["p,q", "r", '"s"', "t"]
    out = io.BytesIO()
    wk.write_tensor_csv(out, tensor, ("head", "source position", "d_k"), labels)
    data = out.getvalue()
    assert len(data) <= wk.tensor_csv_size(tensor.shape, ("head", "source position", "d_k"), labels)
    frame = pd.read_csv(io.BytesIO(data), keep_default_na=False)
    assert list(frame.columns) == ["head", "source_position", "token", "d_k", "value"]
    np.testing.assert_array_equal(frame["value"].to_numpy(np.float32).reshape(tensor.shape), tensor)
    assert frame["token"].tolist() == [t for _ in range(2) for t in labels for _ in range(3)]
    index = np.indices(tensor.shape).reshape(3, -1)
    for i, column in enumerate(("head", "source_position", "d_k")):  # heads from 1, as the app counts them
        np.testing.assert_array_equal(frame[column].to_numpy(), index[i] + (column == "head"))


# ---------------------------------------------------------------------------------------------
# In the app: what the download buttons get, and what a session keeps


def reached_array_bytes(roots, limit: int = 200_000) -> int:
    """Bytes of the numpy arrays reachable from ``roots`` through closures, attributes and containers
    (not through modules, classes or a function's globals: what a kept callable or state holds)."""
    seen, stack, total = set(), list(roots), 0
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            total += obj.nbytes
            continue
        if isinstance(obj, types.FunctionType):
            stack += [c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None]
            stack += list(obj.__defaults__ or ())
            continue
        stack += gc.get_referents(obj)
    return total


@pytest.fixture
def buttons(monkeypatch):
    """Every download button the app draws: (label, data) as Streamlit is given them."""
    drawn = []
    real = DeltaGenerator.download_button

    def record(self, label, data, *args, **kwargs):
        drawn.append((label, data))
        return real(self, label, data, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    on_main = st.download_button  # bound to the main container when Streamlit was imported

    def record_main(label, data, *args, **kwargs):
        drawn.append((label, data))
        return on_main(label, data, *args, **kwargs)

    monkeypatch.setattr(st, "download_button", record_main)
    return drawn


@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_download_callables_and_session_hold_keys_not_maps(buttons):
    at = open_app("pages/explorer.py")
    for view in ("grid", "aggregate", "lines", "one"):
        at.selectbox(key="view").set_value(view).run()
    at.toggle(key="scores").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    csv = [data for label, data in buttons if label == "CSV of what is shown"]
    assert len(csv) >= 5 and all(callable(data) for data in csv)
    assert reached_array_bytes(csv) == 0, "a download's callable holds maps"
    # built on a click, from the cache: the file is the long form of what is shown
    rows = read(csv[-1]())
    assert list(rows.columns)[-1] == "score" and len(rows) > 1
    npz = [data for label, data in buttons if label == "NPZ of every map"]
    assert reached_array_bytes(npz) == 0
    assert np.load(io.BytesIO(npz[-1]())).files  # a readable .npz
    state = {k: at.session_state[k] for k in at.session_state}  # what a closed tab's session keeps
    assert reached_array_bytes(list(state.values())) == 0, "the session state holds maps"


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_methods_page_keeps_no_maps(buttons):
    at = open_app("pages/beyond.py")
    at.radio(key="bw_method").set_value("grad-attention").run()  # its position picker names decoder tokens
    assert not at.exception, [e.value for e in at.exception]
    held = [data for label, data in buttons if "CSV" in label or "NPZ" in label]
    assert len(held) >= 2 and reached_array_bytes(held) == 0
    assert read(held[0]()).shape[0] > 1
    state = {k: at.session_state[k] for k in at.session_state}
    assert reached_array_bytes(list(state.values())) == 0, "a bound widget's format_func holds maps"


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_walkthroughs_full_tensors_are_built_on_a_click_from_keys(buttons):
    at = open_app("pages/walkthrough.py")
    for _ in range(3):  # past the tokens, to the first stage with tensors
        at.button(key="_wt_next").click().run()
    assert not at.exception, [e.value for e in at.exception]
    held = [data for label, data in buttons if label.startswith("CSV of the full")]
    assert held and reached_array_bytes(held) == 0
    frame = pd.read_csv(io.BytesIO(held[-1]()), keep_default_na=False)
    assert list(frame.columns)[-1] == "value" and len(frame) > 1


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_a_download_over_the_limit_is_refused_before_it_is_built(monkeypatch, buttons):
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", "0.001")  # about 1 KB: every file of the page is larger
    at = open_app("pages/explorer.py")
    assert not at.exception, [e.value for e in at.exception]
    assert not [label for label, _ in buttons if label in ("CSV of what is shown", "NPZ of every map")]
    notes = " ".join(i.value for i in at.info)
    assert "CSV of what is shown" in notes and "NPZ of every map" in notes and "ATTNVIZ_MAX_EXPORT_MB" in notes


# ---------------------------------------------------------------------------------------------
# Memory, measured in a process of its own

CSV_MEMORY = r"""
import sys
from pathlib import Path

from attnviz import analysis, api
from attnviz.app.widgets import Download, _built


def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024


lm = api.load("induction-long", "cpu")
words = lm.info["examples"][0].split() * 400  # 2,000 words: more tokens than 2,000, fewer than the model's 4,096
low, high = 1, len(words)  # the most words whose text is at most 2,000 tokens
while low < high:
    mid = (low + high + 1) // 2
    low, high = (mid, high) if len(lm.tokenizer.encode_source(" ".join(words[:mid])).ids) <= 2000 else (low, mid - 1)
export = api.attention(lm, " ".join(words[:low]))
maps, tokens = export.decoder, export.tokens("decoder")
size = analysis.long_form_csv_size(maps.shape, *tokens)  # the bound the explorer checks
file = Download(size, lambda out: analysis.long_form_csv(out, maps, *tokens))
Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
before = status("VmRSS")
data = _built(file.write)
peak = status("VmHWM")
print(maps.shape[-1], maps.shape[0] * maps.shape[1], len(data) / 2**20, file.size / 2**20, before, peak)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak RSS reset")
def test_a_csv_of_every_head_at_2000_tokens_takes_its_own_size_plus_100_mb():
    done = subprocess.run(
        [sys.executable, "-c", CSV_MEMORY], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tokens, heads, size_mb, bound_mb, before, peak = (float(v) for v in done.stdout.split())
    assert tokens >= 1900 and heads == 8, "every head of a text near 2,000 tokens"
    assert size_mb <= bound_mb
    assert peak - before <= size_mb + 100, f"{peak - before:.0f} MB for a {size_mb:.0f} MB file"


def test_export_write_is_to_bytes():
    export = AttentionExport(
        encoder=np.full((1, 1, 2, 2), 0.5, np.float32),
        decoder=None,
        cross=None,
        src_ids=np.array([1, 2]),
        tgt_ids=None,
        src_tokens=("a", "b"),
        tgt_tokens=None,
        manifest={},
    )
    out = io.BytesIO()
    export.write(out)
    assert out.getvalue() == export.to_bytes()


# ---------------------------------------------------------------------------------------------
# The closed-tabs benchmark


@pytest.mark.slow
def test_closed_tabs_benchmark_prints_its_contract_and_stays_bounded():
    cache = 32
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_class.py", "--tabs", "6", "--tab-tokens", "1000", "--cache-mb", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"tabs=6 rss_before_mb=(\d+) rss_after_mb=(\d+)", last)
    assert found, last
    before, after = (int(v) for v in found.groups())
    assert before > 100 and after - before <= cache + 100, last


@pytest.fixture
def named(monkeypatch):
    """Every download button the app draws: its file name -> (label, data)."""
    drawn = {}
    real, on_main = DeltaGenerator.download_button, st.download_button

    def record(self, label, data, file_name=None, *args, **kwargs):
        drawn[file_name] = (label, data)
        return real(self, label, data, file_name, *args, **kwargs)

    def record_main(label, data, file_name=None, *args, **kwargs):
        drawn[file_name] = (label, data)
        return on_main(label, data, file_name, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    monkeypatch.setattr(st, "download_button", record_main)
    return drawn


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_each_file_is_named_for_what_it_holds(named):
    """The model's whole name, the head of a per-head method, the position explained, pieces for scores, and a
    per-layer method's 'head' written as all of them: no two views download under one name."""
    at = open_app("pages/explorer.py")
    at.radio(key="kind").set_value("cross").run()
    at.selectbox(key="layer").set_value(2).run()
    at.selectbox(key="head").set_value(3).run()
    assert {"en-de-cross-L2H3.csv", "en-de-attention.npz"} <= set(named), sorted(named)
    at.toggle(key="words").set_value(True).run()
    assert {"en-de-cross-words-L2H3.csv", "en-de-words-attention.npz"} <= set(named), sorted(named)
    at.toggle(key="scores").set_value(True).run()
    scores = read(named["en-de-cross-scores-L2H3.csv"][1]())
    assert list(scores.columns)[-1] == "score" and "▁Thursday" in set(scores["key_token"]), "pieces, not words"

    named.clear()
    at = open_app("pages/beyond.py")
    at.radio(key="bw_kind").set_value("cross").run()
    at.selectbox(key="bw_layer").set_value(2).run()
    at.selectbox(key="bw_head").set_value(3).run()
    assert "en-de-cross-L2H3-norm.csv" in named, sorted(named)
    at.radio(key="bw_method").set_value("value-zeroing").run()
    per_layer = read(named["en-de-cross-L2-value-zeroing.csv"][1]())
    assert set(per_layer["layer"]) == {2} and set(per_layer["head"]) == {"all"}
    at.radio(key="bw_method").set_value("grad-attention").run()
    at.selectbox(key="bw_position").set_value(2).run()
    assert "en-de-cross-L2-grad-attention-position2.csv" in named, sorted(named)
    assert not at.exception, [e.value for e in at.exception]
