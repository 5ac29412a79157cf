"""Shared fixtures: a tiny seeded model, its config, a tiny sentencepiece model, padded batches."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnviz.export import AXES, AttentionExport
from attnviz.kinds import causal_mask
from attnviz.model import Transformer, TransformerConfig
from attnviz.threads import compute_on
from attnviz.tokenizer import train_sentencepiece
from attnviz.training.data import get_task

# The test extra's JupyterLab brings rfc3987-syntax (jupyter-events asks for jsonschema[format-nongpl]),
# which neither the app's install nor Ray's has. Where it is installed, jsonschema imports it, and it
# builds an Earley parser from its grammar as it is imported: 2.3 CPU s in every process that imports
# jsonschema, and every Ray process does (Ray checks runtime environments with it), as do Jupyter's
# servers. The tests and the processes they start run without it, as the product's installs do
# (jsonschema then leaves the "iri" formats unchecked): the two-node Ray tests alone went from 145 to
# 89 CPU s, and from 101 to 67 s, on a quiet 2-core AMD EPYC with AVX2 only. Set before anything imports
# jsonschema, and inherited by the xdist workers, servers, Ray nodes and kernels the tests start.
SHIMS = str(Path(__file__).resolve().parent / "shims")
if SHIMS not in sys.path:
    sys.path.insert(0, SHIMS)
if SHIMS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # an xdist worker has it from its controller
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SHIMS, os.environ.get("PYTHONPATH")]))

# Tests never reach the network: a hub id resolves from a cache a test builds, or fails (the servers
# that the browser test and the benchmarks start inherit this).
os.environ["HF_HUB_OFFLINE"] = "1"

# The app servers and AppTests the tests start their heavy-work processes at their first heavy job,
# not with their first model: a full run then started 22 such processes where it had started 42 (process
# accounting), each a process start and a model load (about 1.4 CPU s). The browser modules' shared
# server keeps the default warm-up (`test_browser.serving_test_models`); tests/test_heavy.py tests both.
os.environ.setdefault("ATTNVIZ_HEAVY_WARM", "0")

# The tiny model gains nothing from intra-op threads, and on a machine whose cores are busy they
# make each small op wait for a spinning peer (measured: 100x slower decoding on 2 busy cores).
# numpy's BLAS likewise (attnviz.threads: SVDs up to 240x slower where processes share 2 cores); the servers
# and workers the tests start take one thread themselves, as the app does.
compute_on(1)

TINY_VOCAB = 50
FIRST_ORDINARY_ID = 4  # ids 0..3 are pad, bos, eos, unk in every attnviz vocabulary
# The config's activations as torch's own functions: a reference independent of attnviz.linear.
EAGER_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


def tiny_config(**overrides) -> TransformerConfig:
    """The tiny test config, with some fields replaced."""
    fields = dict(
        src_vocab_size=TINY_VOCAB,
        tgt_vocab_size=TINY_VOCAB,
        n_enc_layers=2,
        n_dec_layers=2,
        d_model=32,
        n_heads=4,
        d_ff=64,
        dropout=0.0,
        max_len=64,
    )
    return TransformerConfig(**{**fields, **overrides})


def seeded_model(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    """A randomly initialised model in eval mode; the same seed gives the same weights."""
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def random_padded_batch(
    lengths: list[int], seed: int, vocab_size: int = TINY_VOCAB, pad_id: int = 0, first_id: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ordinary ids of the given lengths, right-padded: ids (B, L) long, valid (B, L) bool.

    With ``first_id`` every row starts with it (a decoder input starts with the start token).
    """
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(lengths), width), dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(FIRST_ORDINARY_ID, vocab_size, (n,), generator=g)
        valid[row, :n] = True
        if first_id is not None:
            ids[row, 0] = first_id
    return ids, valid


@pytest.fixture(scope="session", autouse=True)
def rooms_in_a_test_folder(tmp_path_factory):
    """Rooms that tests (and the servers they start) open live in a test folder, not the user's cache."""
    if "ATTNVIZ_ROOMS_DIR" not in os.environ:
        os.environ["ATTNVIZ_ROOMS_DIR"] = str(tmp_path_factory.mktemp("rooms"))
        yield
        os.environ.pop("ATTNVIZ_ROOMS_DIR", None)  # a test's monkeypatch may have taken it away already
    else:
        yield


@pytest.fixture(scope="session")
def browser_app(tmp_path_factory):
    """The address of one app server that the browser modules share (test_browser.serving_test_models).

    A fresh server imports torch and loads each model on its first visit: the modules whose server has
    no setting of its own (test_browser, test_browser_clicks, test_browser_phone, test_browser_long_model,
    test_doc_links) start it once per session, not once each.
    """
    from test_browser import serving_test_models

    with serving_test_models(tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module")
def browser_tab(request, browser):
    """The module's one tab (browser_wait.Tab) in its own ``browser``: a test opens its pages in it by address
    and leaves it open. A module's ``TAB_INIT_SCRIPT``, if it has one, runs in every document the tab opens."""
    from browser_wait import Tab

    shared = Tab(browser, getattr(request.module, "TAB_INIT_SCRIPT", None))
    yield shared
    shared.close()


@pytest.fixture(scope="session")
def tiny_cfg() -> TransformerConfig:
    return tiny_config()


@pytest.fixture
def tiny_model(tiny_cfg) -> Transformer:
    # Function scope: building it takes milliseconds, and no test can leak changes into another.
    return seeded_model(tiny_cfg, seed=0)


@pytest.fixture(scope="session")
def padded_batch():
    """The padded-batch builder, for tests that want their own lengths."""
    return random_padded_batch


@pytest.fixture(scope="session")
def batch(tiny_cfg) -> dict[str, torch.Tensor]:
    """A padded batch of three pairs whose source and target lengths all differ."""
    src, src_valid = random_padded_batch([6, 9, 3], seed=1, pad_id=tiny_cfg.pad_id)
    tgt, tgt_valid = random_padded_batch([7, 2, 5], seed=2, pad_id=tiny_cfg.pad_id, first_id=tiny_cfg.bos_id)
    return {"src": src, "src_valid": src_valid, "tgt": tgt, "tgt_valid": tgt_valid}


@pytest.fixture(scope="session")
def reverse_pairs() -> list[tuple[str, str]]:
    return get_task("reverse").pairs(300, 0)


@pytest.fixture(scope="session")
def tiny_spm(reverse_pairs) -> bytes:
    """A byte-pair sentencepiece model with exactly TINY_VOCAB pieces, trained in memory."""
    return train_sentencepiece([s for pair in reverse_pairs for s in pair], TINY_VOCAB, "bpe")


# ---------------------------------------------------------------------------------------------
# Exports without a model: plain numpy maps that keep every invariant of attention weights

TOY_SRC = ("▁the", "▁cat", "▁sat", "▁down", "</s>")
TOY_TGT = ("<s>", "▁die", "▁Katze", "▁saß")


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def toy_export(seed: int = 0, layers: int = 2, heads: int = 4, **manifest) -> AttentionExport:
    """An export of random post-softmax maps over TOY_SRC and TOY_TGT: rows sum to 1, the future is exactly 0."""
    rng = np.random.default_rng(seed)
    S, T = len(TOY_SRC), len(TOY_TGT)
    decoder = _softmax(np.where(causal_mask(T), rng.normal(size=(layers, heads, T, T)), -np.inf))
    return AttentionExport(
        encoder=_softmax(rng.normal(size=(layers, heads, S, S))),
        decoder=decoder,
        cross=_softmax(rng.normal(size=(layers, heads, T, S))),
        src_ids=np.arange(10, 10 + S, dtype=np.int64),
        tgt_ids=np.arange(20, 20 + T, dtype=np.int64),
        src_tokens=TOY_SRC,
        tgt_tokens=TOY_TGT,
        manifest={"model": "toy", "src": "the cat sat down", "tgt": "die Katze saß", "axes": AXES, **manifest},
    )


# ---------------------------------------------------------------------------------------------
# AppTest: Streamlit's caches are process-global, so app tests start from empty ones.


_BYTECODE: dict[tuple, object] = {}  # (script's path, its text, magic on) -> its compiled code, for every AppTest


def _compiled_once(get_bytecode):
    """ScriptCache.get_bytecode, kept across ScriptCaches for a script whose text has not changed."""

    @functools.wraps(get_bytecode)
    def wrapper(self, script_path):
        from streamlit import config

        path = os.path.abspath(script_path)
        with open(path, "rb") as f:
            key = (path, f.read(), config.get_option("runner.magicEnabled"))
        if key not in _BYTECODE:
            _BYTECODE[key] = get_bytecode(self, script_path)
        return _BYTECODE[key]

    wrapper.compiled_once = True
    return wrapper


def _woken_at_the_end(runner_class):
    """``runner_class.__init__`` that gives each runner an event set when its script thread shuts down."""
    init = runner_class.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        from streamlit.runtime.scriptrunner import ScriptRunnerEvent

        init(self, *args, **kwargs)
        self.shut_down = threading.Event()

        def on_event(sender, event, **_) -> None:  # noqa: ARG001 - the signal's signature
            if event == ScriptRunnerEvent.SHUTDOWN:
                self.shut_down.set()

        self.on_event.connect(on_event, weak=False)

    __init__.woken = True
    return __init__


def _wait_for_shutdown(runner, timeout: float = 3) -> None:
    """Streamlit's ``require_widgets_deltas``, waiting on the runner's event instead of looking every millisecond."""
    if runner.shut_down.wait(timeout):  # every runner is made after both patches (AppTest makes one a run)
        return
    runner.request_stop()  # as Streamlit's: stop the script before saying it ran out of time
    runner.join()
    raise RuntimeError(f"AppTest script run timed out after {timeout}(s)")


def pytest_runtest_setup(item):
    """Once Streamlit is imported, every AppTest reuses one scan of the installed component manifests and
    one compiling of each page's script, and waits for its script's end without polling.

    Streamlit 1.67 scans every installed distribution's metadata for component manifests on each new
    AppTest's first run (about 700 metadata files parsed: most of the time of an AppTest whose page is
    cached). The installed packages do not change during a test session, so they are scanned once;
    servers the tests start still scan for themselves. Each new AppTest also has a ScriptCache of its
    own, which compiles app.py and every page it opens again, after rewriting each script's syntax
    tree for Streamlit's "magic": a tenth of the AppTest clicks module's profile on a 2-core AMD EPYC
    with AVX2 only. A script is compiled once per text of it.

    While a script runs, AppTest's own thread looked every millisecond whether it had ended, scanning
    the run's events each time (one per message the script sent), and took Python's lock from the
    script's thread to do so: 11% of py-spy's samples of test_app and test_app_clicks, whose 97 tests
    took 82.8-83.1 CPU s of user time waiting on an event and 83.9-84.8 polling, with a third less
    system time (2.5-2.7 s against 3.7-4.4; two runs each, alternated, on that EPYC).
    """
    if "streamlit" not in sys.modules:
        return
    from streamlit.components.v2 import manifest_scanner
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import local_script_runner

    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)
    if not getattr(ScriptCache.get_bytecode, "compiled_once", False):
        ScriptCache.get_bytecode = _compiled_once(ScriptCache.get_bytecode)
    runner = local_script_runner.LocalScriptRunner
    if not getattr(runner.__init__, "woken", False):
        runner.__init__ = _woken_at_the_end(runner)
        local_script_runner.require_widgets_deltas = _wait_for_shutdown


@pytest.fixture
def visitor_roots(monkeypatch, tmp_path_factory):
    """Let visitors of the app open the folders tests make: the tests' temporary folder is a model root."""
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path_factory.getbasetemp()))


@contextlib.contextmanager
def _kept(owner, name: str, key_of):
    """``owner.<name>`` replaced, inside the block, by one that keeps each answer under ``key_of(*args,
    **kwargs)`` (None: asked afresh each time) and hands it back when asked again; yields the answers kept."""
    original, memo = getattr(owner, name), {}

    @functools.wraps(original)
    def kept(*args, **kwargs):
        key = key_of(*args, **kwargs)
        if key is None:
            return original(*args, **kwargs)
        if key not in memo:
            memo[key] = original(*args, **kwargs)
        return memo[key]

    setattr(owner, name, kept)
    try:
        yield memo
    finally:
        setattr(owner, name, original)


@pytest.fixture(scope="session", autouse=True)
def one_clearest_head_per_model():
    """`attnviz.api.clearest_head`, computed once per model in a test process, as in the app's.

    The app keeps each model's clearest head for the life of its process (`attnviz.app.cache.clearest_head`),
    but AppTests start from empty caches (`fresh_streamlit_caches`), so every AppTest of a translation
    model computed it again: a greedy translation and a forward pass of each of the card's first eight
    examples, 0.4 s for en-de on a 2-core AMD EPYC with AVX2 only, and a fifth of the AppTest clicks
    module's time. The answer is a function of what the key below holds (the weights by their digest, the
    card, the config, the tokenizer's files, the device, the kind and the number of examples read), so
    a test that edits any of them gets its own; a bundle not read from files is not kept. A test that
    counts the computing empties the memo, which is what the fixture yields.
    """
    from attnviz import api

    def stamp(folder: Path) -> tuple:
        files = [(p.name, p.stat()) for p in folder.iterdir() if p.is_file()]
        return tuple(sorted((name, s.st_size, s.st_mtime_ns) for name, s in files))

    def key(bundle, kind=None) -> tuple | None:
        if not bundle.sha256 or not Path(bundle.path).is_dir():
            return None
        info, config, files = repr(bundle.info), repr(bundle.config), stamp(Path(bundle.path))
        return bundle.sha256, info, config, files, str(bundle.device), kind, api.CLEAREST_SENTENCES

    with _kept(api, "clearest_head", key) as memo:
        yield memo


SCRIPT_THREAD = "ScriptRunner.scriptThread"  # the thread Streamlit runs a page's script in, an AppTest's too
KEPT_FILES, KEPT_BYTES = 256, 64 << 20  # a checkpoint folder holding more is loaded afresh each time


def _checkpoint_contents(path) -> tuple | None:
    """(the folder, a digest of the names and bytes of every file below it) for a folder with a config.json
    of its own; None for anything else, or for one holding more than `KEPT_FILES` files or `KEPT_BYTES`."""
    import hashlib

    from attnviz.checkpoints.bundle import sha256_file

    folder = Path(path)
    try:
        if not (folder / "config.json").is_file():
            return None
        files = []
        for root, _, names in os.walk(folder):
            files += [Path(root) / name for name in names]
            if len(files) > KEPT_FILES:
                return None
        if sum(f.stat().st_size for f in files) > KEPT_BYTES:
            return None
        digest = hashlib.sha256()
        for file in sorted(files):
            digest.update(f"{file.relative_to(folder)}\0{sha256_file(file)}\0".encode())
    except OSError:
        return None
    return str(folder.resolve()), digest.hexdigest()


@pytest.fixture(scope="session", autouse=True)
def one_load_per_checkpoint_in_the_app():
    """A checkpoint the app loads in an AppTest, loaded once per contents in a test process, as in the app's.

    The app keeps each loaded model for its process's life (`attnviz.app.cache.load_bundle`, shared by every
    session and never changed), but AppTests start from empty caches (`fresh_streamlit_caches`), so each one
    loaded its models again: 143 loads, 11.4 of about 80 CPU s, in test_app and test_app_clicks on a 2-core
    AMD EPYC with AVX2 only. Here a load made by a page's script is kept under the folder's path, the digest
    of every file below it, the device asked for and the loading limits in force (`ATTNVIZ_MAX_*`): a test that
    writes, breaks or replaces a file, or lowers a limit, gets a load of its own, and a load that fails is
    never kept. Loads made by anything else (the loaders' own tests, the command line, fixtures) are
    untouched."""
    from attnviz import api
    from attnviz.checkpoints.limits import current_limits
    from attnviz.errors import CheckpointError

    def key(path, device="auto") -> tuple | None:
        if threading.current_thread().name != SCRIPT_THREAD:
            return None
        try:
            limits = current_limits()
        except CheckpointError:  # a limit set wrong: the load says so in its own order of checks
            return None
        contents = _checkpoint_contents(path)
        return None if contents is None else (*contents, device, limits)

    with _kept(api, "load_checkpoint", key) as memo:
        yield memo


@pytest.fixture
def fresh_streamlit_caches():
    import streamlit as st

    from attnviz.app.cache import RESULTS

    st.cache_data.clear()
    st.cache_resource.clear()
    RESULTS.clear()


def open_app(page: str = "app.py", model: str | None = None):
    """An AppTest of the app, on ``model`` when given, switched to ``page``.

    It starts from app.py and switches pages; with a folder named pages/ beside app.py the page file
    then runs alone (shared/FACTS.md), which is why every page draws the shared sidebar itself.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file("../app.py", default_timeout=120)
    at.run()
    if model is not None:
        at.sidebar.selectbox(key="model").set_value(model).run()
    if page != "app.py":
        at.switch_page(page).run()
    return at


def open_from_link(page: str, params: dict, timeout: float = 120):
    """An AppTest of the app opened from a link: ``params`` in the address bar, then ``page``.

    A browser runs the linked page first; AppTest starts from app.py, whose sidebar reads the
    sidebar's parameters, then switches to ``page`` with the same address.
    """
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file("../app.py", default_timeout=timeout)
    at.query_params.update(params)
    at.run()
    if page != "app.py":
        at.switch_page(page).run()
    return at


# ---------------------------------------------------------------------------------------------
# The order in which the two workers take modules (--dist loadfile hands out whole modules in the
# order collected, given --no-loadscope-reorder in pyproject.toml: pytest-xdist 3.6 and later otherwise
# hand out the modules with the most tests first, which put these, with one to sixteen tests each, last).
# The longest go first, so that the last modules handed out are short ones and neither worker is left
# alone at the end with a long one (in a loaded full run, summed over their tests: the first three
# about 4 minutes each, the next three 1 to 2; docs/suite-time.md). Only the order changes; within
# a module it is kept.
LONGEST_FIRST = (
    "test_benchmark.py",
    "test_browser.py",
    "test_browser_clicks.py",
    "test_atlas_ray.py",
    "test_browser_formation.py",
    "test_browser_follow.py",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every module's own order is kept


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):  # noqa: ARG001 - pytest's signature
    """The test modules imported with the garbage collector held, and all that collecting leaves alive then
    frozen out of its later passes (`attnviz.startup.imports_kept`): what a test process has imported lives
    as long as it does. The collector's own time in each worker over the quick tier went from 5.2-5.3 to
    1.8-2.0 CPU s (gc.callbacks), and three modules' 743 quick tests in one process took 18.3-25.5 CPU s
    against 20.9-25.9, three alternated runs each (2-core AMD EPYC with AVX-512)."""
    from attnviz.startup import imports_kept

    with imports_kept():
        return (yield)
