"""A training's history: what its heads looked like every N steps, written record by record and read back.

``attnviz train TASK --out DIR --history-every N`` writes ``DIR/history/`` (docs/history.md):

- ``manifest.json``: the format and its version, the model's kind and task, the probe texts with
  their tokens, the sites and shapes of their maps, the statistics' names, the recipe and versions;
- ``records/00000100/`` per recorded step (its number, 8 digits): ``losses.parquet`` (one row:
  step, train_loss, heldout_loss, lr), ``heads.parquet`` (one row per head: step, kind, layer,
  head, then every statistic of `attnviz.atlas` over the fixed probe set) and ``maps.npz`` (each
  probe's full maps, float16: ``p{p}_{site}`` (L, H, Q, K)).

A record is written into a temporary folder and renamed into place, so a training killed at any
moment leaves either the whole record or none that counts; a resumed training keeps every record
and writes none twice. A history is data, never code: nothing in it is unpickled, and every file's
size, every array's dtype and shape are checked before it is read whole; every map's weights after
(what a softmax gives: each row sums to 1, a causal map's row sees no later token).

Shape letters: N records, L layers, H heads, Q queries, K keys (rows are queries, columns keys).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import stat
import zipfile
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.errors import InputError, describe
from attnviz.export import array_members, max_export_bytes, path_argument, size_text

HISTORY = "history"  # the folder inside a training's --out
RECORDS = "records"
MANIFEST = "manifest.json"
LOSSES, HEADS, MAPS = "losses.parquet", "heads.parquet", "maps.npz"
FORMAT = "attnviz-history"
# Every layout of a history folder attnviz has written; load_history reads them all and refuses a newer one.
FORMAT_VERSIONS = {1: "manifest.json and records/NNNNNNNN/{losses.parquet, heads.parquet, maps.npz}"}
FORMAT_VERSION = max(FORMAT_VERSIONS)
ENCODER_DECODER, LANGUAGE_MODEL = "encoder-decoder", "language model"
SITES = {ENCODER_DECODER: ("encoder", "decoder", "cross"), LANGUAGE_MODEL: ("decoder",)}
LOSS_COLUMNS = ("step", "train_loss", "heldout_loss", "lr")
HEAD_COLUMNS = ("step", "kind", "layer", "head")
RECORD_NAME = re.compile(r"^[0-9]{8,10}$")
TEMP_PREFIX = ".tmp-"
MAX_RECORDS = 100_000
MAX_PROBES = 16
MAX_MANIFEST_BYTES = 1 << 20
MAX_TABLE_BYTES = 16 << 20  # per Parquet file of one record: a real one is a few kB
MAX_HEAD_ROWS = 100_000  # per record: heads of every kind
# What one record's table may decompress to, read from its metadata: a file of 208 kB, runs of one value, had held
# 255 MB (a real table is a few hundred values of about 20 columns, a few kB).
MAX_TABLE_COLUMNS = 256
MAX_TABLE_VALUES = 4_000_000  # rows times columns: 32 MB of float64
MAX_TABLE_DECODED_BYTES = 64 << 20
# The head rows of all records together, counted from each table's metadata before it is read: a history is read
# whole, at about 100 bytes a row (en-de's 50 records are 1,800 rows; 2,000,000 are about 200 MB).
MAX_HISTORY_ROWS = 2_000_000
# How far a stored row of weights may sum from 1: float16 keeps 11 bits, so a softmax row's rounding errors add up to
# about 5e-4 at most; a row a hundred times further off was not written by a softmax.
ROW_SUM_TOLERANCE = 1e-2
CAUSAL_SITE = "decoder"  # the decoder's self-attention (a language model's too) sees no later token

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probe:
    """One fixed probe text and its maps at every recorded step."""

    text: str  # the probe's source text (a language model: the prompt)
    target: str | None  # an encoder-decoder model: the reference target, the decoder's input; a language model: None
    src_tokens: list[str] | None  # None for a language model
    tgt_tokens: list[str]  # the decoder's input (a language model: the prompt with <s>)
    # site -> (N, L, H, Q, K) float16; sites "encoder", "decoder", "cross" (a language model: "decoder" only)
    maps: dict[str, np.ndarray]


@dataclass(frozen=True)
class History:
    """Every record of one training's history, stacked on one step axis."""

    folder: Path
    kind: str  # "encoder-decoder" or "language model"
    task: str  # "reverse", "en-de", "induction", ...
    step: np.ndarray  # (N,) int64, ascending, unique
    train_loss: np.ndarray  # (N,) float64: the running mean of the training loss at that step
    heldout_loss: np.ndarray  # (N,) float64: on a fixed held-out batch, in eval mode
    lr: np.ndarray  # (N,) float64
    heads: pd.DataFrame  # one row per (step, kind, layer, head), layer and head from 1, then each statistic
    probes: list[Probe]
    manifest: dict

    @property
    def statistics(self) -> list[str]:
        """The names of the statistic columns of `heads`."""
        return [c for c in self.heads.columns if c not in HEAD_COLUMNS]

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of `attnviz history --out F.npz`: step, train_loss, heldout_loss (N,), and per probe p
        ``p{p}_src_tokens`` (encoder-decoder only), ``p{p}_tgt_tokens`` and ``p{p}_{site}`` (N, L, H, Q, K)
        float16, then ``manifest`` (JSON text). Numbers and unicode strings only: no objects."""
        arrays: dict[str, np.ndarray] = {
            "step": self.step,
            "train_loss": self.train_loss,
            "heldout_loss": self.heldout_loss,
        }
        for p, probe in enumerate(self.probes):
            if probe.src_tokens is not None:
                arrays[f"p{p}_src_tokens"] = np.array(probe.src_tokens, dtype=str)
            arrays[f"p{p}_tgt_tokens"] = np.array(probe.tgt_tokens, dtype=str)
            for site in SITES[self.kind]:
                arrays[f"p{p}_{site}"] = probe.maps[site]
        arrays["manifest"] = np.array(json.dumps(self.manifest, ensure_ascii=False))
        return arrays


# ---------------------------------------------------------------------------------------------
# Writing


def _history_folder(out: Path) -> Path:
    out = path_argument("out", out, "a training's --out folder or its history folder")
    return out if out.name == HISTORY else out / HISTORY


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _fsync_folder(folder: Path) -> None:
    for path in folder.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _record_name(step: int) -> str:
    return f"{step:08d}"


class HistoryWriter:
    """Writes a training's history, one whole record per `record` call; resumes a folder written before.

    ``out`` is the training's --out (the history goes to ``out/history``) or the history folder
    itself. ``probes`` are (text, target) pairs (a language model: target None), ``tokens`` their
    (source tokens or None, decoder-input tokens), and ``manifest`` what the history's manifest adds
    (model config, recipe, versions). An existing history of another task, kind or probe set is
    refused: a resumed training continues its own history.
    """

    def __init__(
        self,
        out: Path,
        kind: str,
        task: str,
        probes: Sequence[tuple[str, str | None]],
        manifest: dict,
        *,
        tokens: Sequence[tuple[Sequence[str] | None, Sequence[str]]] | None = None,
    ):
        if kind not in SITES:
            raise ValueError(f"kind must be one of {', '.join(SITES)}; got {kind!r}")
        if not probes or len(probes) > MAX_PROBES:
            raise ValueError(f"give 1 to {MAX_PROBES} probe texts; got {len(probes)}")
        if tokens is not None and len(tokens) != len(probes):
            raise ValueError(f"{len(tokens)} token lists for {len(probes)} probes")
        self.folder = _history_folder(out)
        self.kind, self.task = kind, task
        self.probes = [(str(text), None if target is None else str(target)) for text, target in probes]
        self.tokens = None if tokens is None else [(None if s is None else list(s), list(t)) for s, t in tokens]
        self.extra = dict(manifest)
        self.records = self.folder / RECORDS
        self.records.mkdir(parents=True, exist_ok=True)
        self._clean_temporary()
        self.manifest: dict | None = None
        if (self.folder / MANIFEST).exists():
            self.manifest = _read_manifest(self.folder)
            given = json.loads(json.dumps(self.extra, ensure_ascii=False, allow_nan=False))  # as JSON stores it
            self._check_same(self.manifest, given)
            # A resumed training may run to more steps: the manifest then says what the history now records.
            if any(self.manifest.get(key) != value for key, value in given.items()):
                self.manifest = {**self.manifest, **given}
                _write_json(self.folder / MANIFEST, self.manifest)
        self.steps = {int(p.name) for p in self.records.iterdir() if RECORD_NAME.match(p.name) and p.is_dir()}

    def _clean_temporary(self) -> None:
        """Remove what a killed run left half-written: temporary record folders and files."""
        for folder in (self.records, self.folder):
            for path in folder.iterdir():
                if path.name.startswith(TEMP_PREFIX):
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def _check_same(self, manifest: dict, given: dict) -> None:
        """Refuse the history of another training than the one ``given`` (this writer's manifest, as JSON stores
        it) describes: another task, kind, probe set, seed or recipe (its number of steps aside: a resumed
        training may run to more)."""
        probes = [(p.get("text"), p.get("target")) for p in manifest.get("probes", [])]

        def recipe(m: dict) -> dict | None:
            return {k: v for k, v in m["recipe"].items() if k != "steps"} if isinstance(m.get("recipe"), dict) else None

        same = (
            manifest.get("kind") == self.kind
            and manifest.get("task") == self.task
            and probes == self.probes
            and manifest.get("seed") == given.get("seed")
            and recipe(manifest) == recipe(given)
        )
        if not same:
            raise InputError(
                f"{self.folder} holds the history of another training (task {manifest.get('task')!r}, "
                f"{manifest.get('kind')}, seed {describe(manifest.get('seed'))}, or other probes or recipe): write "
                "this one into another --out"
            )

    def _first_manifest(self, maps: Sequence[Mapping[str, np.ndarray]], statistics: list[str]) -> dict:
        probes = []
        for p, ((text, target), probe_maps) in enumerate(zip(self.probes, maps, strict=True)):
            shapes = {site: list(np.shape(probe_maps[site])) for site in SITES[self.kind]}
            if self.tokens is not None:
                src_tokens, tgt_tokens = self.tokens[p]
            else:  # no tokens given: positions stand for them
                first = shapes["encoder"] if self.kind == ENCODER_DECODER else None
                src_tokens = None if first is None else [str(i) for i in range(first[-1])]
                tgt_tokens = [str(i) for i in range(shapes["decoder"][-1])]
            probes.append(
                {"text": text, "target": target, "src_tokens": src_tokens, "tgt_tokens": tgt_tokens, "shapes": shapes}
            )
        return {
            **self.extra,
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "task": self.task,
            "sites": list(SITES[self.kind]),
            "probes": probes,
            "statistics": statistics,
            "note": "rows are queries, columns are keys; maps are post-softmax, per head, float16",
        }

    def _check_maps(self, maps: Sequence[Mapping[str, np.ndarray]]) -> None:
        if len(maps) != len(self.probes):
            raise ValueError(f"maps for {len(maps)} probes; the history has {len(self.probes)}")
        for p, probe_maps in enumerate(maps):
            if set(probe_maps) != set(SITES[self.kind]):
                raise ValueError(f"probe {p}: maps of {sorted(probe_maps)}, not of {list(SITES[self.kind])}")
            for site, array in probe_maps.items():
                if np.ndim(array) != 4:
                    raise ValueError(f"probe {p}, {site}: maps must be (L, H, Q, K); got shape {np.shape(array)}")
                if self.manifest is not None:
                    want = self.manifest["probes"][p]["shapes"][site]
                    if list(np.shape(array)) != want:
                        raise ValueError(f"probe {p}, {site}: shape {np.shape(array)}, the history's is {tuple(want)}")

    def record(
        self,
        step: int,
        train_loss: float,
        heldout_loss: float,
        lr: float,
        maps: Sequence[Mapping[str, np.ndarray]],
        heads: pd.DataFrame,
    ) -> bool:
        """Write the record of ``step``: True, or False when the history holds that step already.

        ``maps``: per probe, {site: (L, H, Q, K)} (stored as float16); ``heads``: one row per head
        with kind, layer, head (from 1) and each statistic (its ``step`` column is set here).
        """
        step = int(step)
        if step < 0 or step >= 10**10:
            raise ValueError(f"step must be 0 to 9,999,999,999; got {step}")
        if step in self.steps:
            log.info("the history holds step %d already: not written again", step)
            return False
        self._check_maps(maps)
        statistics = [c for c in heads.columns if c not in HEAD_COLUMNS]
        if self.manifest is None:
            self.manifest = self._first_manifest(maps, statistics)
            _write_json(self.folder / MANIFEST, self.manifest)
        name = _record_name(step)
        tmp = self.records / f"{TEMP_PREFIX}{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        losses = pd.DataFrame(
            {
                "step": np.array([step], dtype=np.int64),
                "train_loss": [float(train_loss)],
                "heldout_loss": [float(heldout_loss)],
                "lr": [float(lr)],
            }
        )
        losses.to_parquet(tmp / LOSSES, index=False)
        table = heads.drop(columns=["step"], errors="ignore").copy()
        table.insert(0, "step", np.int64(step))
        table.to_parquet(tmp / HEADS, index=False)
        arrays = {
            f"p{p}_{site}": np.asarray(probe_maps[site], dtype=np.float16)
            for p, probe_maps in enumerate(maps)
            for site in SITES[self.kind]
        }
        with open(tmp / MAPS, "wb") as f:
            np.savez_compressed(f, **arrays)
        _fsync_folder(tmp)
        os.replace(tmp, self.records / name)  # the record counts from here on, whole
        self.steps.add(step)
        return True


# ---------------------------------------------------------------------------------------------
# Reading


def _checked_file(folder: Path, name: str, max_bytes: int, what: str) -> Path:
    """``folder / name`` when it is a regular file inside the history and at most ``max_bytes``; else an InputError."""
    path = folder / name
    try:
        if path.is_symlink():
            raise InputError(f"{what}: {name} is a link; a history holds plain files only")
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{what} has no {name}: it is incomplete; train again or delete that record") from None
    except (OSError, RuntimeError) as e:
        raise InputError(f"{what}: {name} cannot be read ({type(e).__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{what}: {name} is not a regular file")
    if info.st_size > max_bytes:
        raise InputError(
            f"{what}: {name} is {info.st_size / 2**20:,.1f} MB, over the limit of {max_bytes / 2**20:g} MB"
        )
    return path


def _find(folder: Path) -> Path:
    """The history folder of ``folder`` (a training's --out, or its history/ itself)."""
    folder = Path(folder)
    for candidate in (folder / HISTORY, folder):
        if (candidate / MANIFEST).is_file() and (candidate / RECORDS).is_dir():
            for linked in (candidate, candidate / RECORDS):  # a link could lead out of the folders a visitor may open
                if linked.is_symlink():
                    raise InputError(f"the history's {linked.name} folder is a link; a history holds plain folders")
            return candidate
    how = "a history is written by `attnviz train TASK --out DIR --history-every N` into DIR/history"
    raise InputError(
        f"no training history in {folder}: {how}", public=f"this model folder has no training history: {how}"
    )


def recorded_every(out: Path) -> int:
    """How many steps apart the history in a training's ``out`` was recorded: its manifest's ``every``, 0 for none."""
    folder = _history_folder(out)
    if not (folder / MANIFEST).exists():
        return 0
    every = _read_manifest(folder).get("every", 0)
    return every if type(every) is int and every > 0 else 0


def _no_constant(name: str):
    """Refuse NaN and Infinity, which Python's json reads but JSON lacks: the writer (allow_nan=False) and an
    export of the manifest would fail on them later."""
    raise InputError(f"the history's manifest.json holds NaN or Infinity ({name}): JSON has no such number")


def _read_manifest(folder: Path) -> dict:
    path = _checked_file(folder, MANIFEST, MAX_MANIFEST_BYTES, "the history")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except InputError:
        raise
    except (OSError, ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, an integer of 4,300 digits
        raise InputError(f"the history's manifest.json cannot be read ({type(e).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(f"manifest.json is not an attnviz history's manifest (format {FORMAT!r})")
    version = manifest.get("format_version")
    if type(version) is not int or version < 1:
        raise InputError(f"the history's manifest has an unreadable format_version {version!r}")
    if version > FORMAT_VERSION:
        raise InputError(
            f"the history was written by a newer attnviz (history format {version}; this attnviz reads formats 1 to "
            f"{FORMAT_VERSION}): upgrade attnviz to read it"
        )
    _check_manifest(manifest)
    return manifest


def _is_tokens(value) -> bool:
    return isinstance(value, list) and len(value) <= 100_000 and all(isinstance(t, str) for t in value)


def _check_manifest(manifest: dict) -> None:
    """The fields the reader uses, of the types it uses: else an InputError."""
    kind, probes = manifest.get("kind"), manifest.get("probes")
    if not isinstance(kind, str) or kind not in SITES:  # a list is not hashable: `in` would raise a TypeError
        raise InputError(f"the history's manifest names no known kind of model (kind {kind!r})")
    if not isinstance(manifest.get("task"), str):
        raise InputError("the history's manifest names no task")
    statistics = manifest.get("statistics")
    if not (isinstance(statistics, list) and all(isinstance(name, str) for name in statistics)):
        raise InputError(f"the history's manifest: its statistics must be a list of names; got {describe(statistics)}")
    if not isinstance(probes, list) or not 1 <= len(probes) <= MAX_PROBES:
        raise InputError(f"the history's manifest must list 1 to {MAX_PROBES} probes")
    for p, probe in enumerate(probes):
        ok = (
            isinstance(probe, dict)
            and isinstance(probe.get("text"), str)
            and (probe.get("target") is None or isinstance(probe["target"], str))
            and _is_tokens(probe.get("tgt_tokens"))
            and (probe.get("src_tokens") is None if kind == LANGUAGE_MODEL else _is_tokens(probe.get("src_tokens")))
            and isinstance(probe.get("shapes"), dict)
        )
        if not ok:
            raise InputError(f"the history's manifest: probe {p} lacks its text, tokens or shapes")
        for site in SITES[kind]:
            shape = probe["shapes"].get(site)
            sizes = isinstance(shape, list) and len(shape) == 4 and all(type(n) is int and 0 < n < 2**20 for n in shape)
            if not sizes:
                raise InputError(f"the history's manifest: probe {p} has no shape (L, H, Q, K) for {site}")
        src, tgt = probe["src_tokens"], probe["tgt_tokens"]
        S, T = len(src or ()), len(tgt)
        expected = {"decoder": (T, T), "encoder": (S, S), "cross": (T, S)}
        for site in SITES[kind]:
            if tuple(probe["shapes"][site][2:]) != expected[site]:
                raise InputError(f"the history's manifest: probe {p}'s {site} shape does not match its tokens")
            (layers, heads), (layers_0, heads_0) = probe["shapes"][site][:2], probes[0]["shapes"][site][:2]
            if (layers, heads) != (layers_0, heads_0):  # one model reads every probe
                raise InputError(
                    f"the history's manifest: probe {p}'s {site} maps have {layers} layers of {heads} heads, probe 0's "
                    f"{layers_0} of {heads_0}: every probe's maps are of the same model"
                )


def _is_text(kind) -> bool:
    """Whether an Arrow type holds text: a string column, or pandas' categories of strings."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _check_decoded_size(metadata, name: str, what: str) -> None:
    """Refuse a table whose metadata says it decompresses past its bounds: too many columns, values or bytes."""
    columns, rows = metadata.num_columns, metadata.num_rows
    if columns > MAX_TABLE_COLUMNS:
        raise InputError(f"{what}: {name} has {columns:,} columns, over the limit of {MAX_TABLE_COLUMNS:,}")
    if rows * columns > MAX_TABLE_VALUES:  # runs of one value compress to nothing: the count bounds them
        raise InputError(
            f"{what}: {name} has {rows:,} rows of {columns:,} columns, over the limit of {MAX_TABLE_VALUES:,} values"
        )
    size = sum(max(metadata.row_group(g).total_byte_size, 0) for g in range(metadata.num_row_groups))
    if size > MAX_TABLE_DECODED_BYTES:  # long text compresses well: a head's kind had held 300 MB
        raise InputError(
            f"{what}: {name} decompresses to {size / 2**20:,.1f} MB, over the limit of "
            f"{MAX_TABLE_DECODED_BYTES / 2**20:g} MB"
        )


def _read_table(
    folder: Path, name: str, columns: Sequence[str], what: str, max_rows: int = MAX_HEAD_ROWS, over: str = ""
) -> pd.DataFrame:
    """One record's table, after its size, its row count (at most ``max_rows``; ``over`` says what that bound
    is) and its columns' names and types are checked from its metadata."""
    import pyarrow.parquet as pq

    path = _checked_file(folder, name, MAX_TABLE_BYTES, what)
    try:
        meta = pq.ParquetFile(path)
        rows, schema = meta.metadata.num_rows, meta.schema_arrow
        if rows > max_rows:
            raise InputError(f"{what}: {name} has {rows:,} rows, over {over or f'the limit of {max_rows:,}'}")
        _check_decoded_size(meta.metadata, name, what)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise InputError(f"{what}: {name} lacks the columns {', '.join(missing)}")
        if "kind" in columns and not _is_text(schema.field("kind").type):  # a list had reached pandas' groupby
            raise InputError(f"{what}: {name} names kinds with other values than text")
        table = pd.read_parquet(path)
        words = [c for c in table.columns if c != "kind" and table[c].dtype.kind not in "iuf"]
        if words:  # every column but a head's kind holds numbers
            raise InputError(f"{what}: {name} holds other values than numbers in {', '.join(map(str, words[:4]))}")
        return table
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own errors for a damaged file
        raise InputError(f"{what}: {name} cannot be read ({type(e).__name__}): it is corrupt") from None


def _members(archive: zipfile.ZipFile, what: str) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by array name, each ``<name>.npy``, once, unencrypted (`attnviz.export.array_members`)."""

    def error(problem: str, member: str) -> InputError:
        return InputError(
            {
                "not an array": f"{what}: {MAPS} holds the member {member[:40]!r}, not a name.npy",
                "twice": f"{what}: {MAPS} holds {member[:40]} twice",
                "encrypted": f"{what}: {MAPS} cannot be read (an encrypted member): it is corrupt",
            }[problem]
        )

    return array_members(archive, error)


def _read_maps(folder: Path, expected: dict[str, tuple[int, ...]], budget: int, what: str) -> tuple[dict, int]:
    """The record's maps {name: (L, H, Q, K) float16} and the bytes they take, each array's header
    checked against the manifest's shape before any is decompressed."""
    path = _checked_file(folder, MAPS, budget, what)
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            names = _members(archive, what)
            if set(names) != set(expected):
                raise InputError(f"{what}: {MAPS} holds {sorted(names)[:8]}, not {sorted(expected)}")
            for name, info in names.items():
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(member)
                if dtype != np.float16 or tuple(shape) != expected[name]:
                    raise InputError(
                        f"{what}: {name} in {MAPS} is {dtype} {tuple(shape)}, not float16 {expected[name]}"
                    )
                total += math.prod(shape) * 2
                if total > budget:
                    raise InputError(
                        f"{what}: the history's maps pass {size_text(budget)} once decompressed "
                        "(ATTNVIZ_MAX_EXPORT_MB raises the bound)"
                    )
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in expected}, total
    except InputError:
        raise
    except (ValueError, KeyError, EOFError, OSError, zipfile.BadZipFile, zlib.error, NotImplementedError) as e:
        raise InputError(f"{what}: {MAPS} cannot be read ({type(e).__name__}): it is corrupt") from None


def _check_heads(table: pd.DataFrame, sizes: dict[str, tuple[int, int]], statistics: Sequence[str], what: str) -> None:
    """Rows of the history's model's heads, exactly one for each (a missing one had made formation_step answer
    another step), each naming a kind it has and a whole layer and head (from 1), with every statistic the
    manifest names."""
    missing = [c for c in statistics if c not in table.columns]
    if missing:
        raise InputError(f"{what}: {HEADS} lacks the statistics {', '.join(map(str, missing[:4]))}")
    if table["layer"].dtype.kind not in "iu" or table["head"].dtype.kind not in "iu":
        raise InputError(f"{what}: {HEADS} numbers layers and heads with other values than whole numbers")
    if table.duplicated(["kind", "layer", "head"]).any():
        kind, layer, head = table.loc[table.duplicated(["kind", "layer", "head"]), ["kind", "layer", "head"]].iloc[0]
        raise InputError(f"{what}: {HEADS} has more than one row for {kind} layer {layer} head {head}")
    if table.empty:
        raise InputError(f"{what}: {HEADS} has no row: a record measures the model's heads")
    if table["kind"].isna().any():  # groupby would leave the row out, and the page file it under another head
        raise InputError(f"{what}: {HEADS} has a row with no kind")
    if table["layer"].hasnans or table["head"].hasnans:  # nullable integers: an empty layer had been exported
        raise InputError(f"{what}: {HEADS} has a row with no layer or head")
    counts = dict.fromkeys(sizes, 0)
    for kind, rows in table.groupby("kind", sort=False):
        if kind not in sizes:
            raise InputError(f"{what}: {HEADS} names the kind {str(kind)[:40]!r}, not one of {', '.join(sizes)}")
        layers, heads = sizes[kind]
        if not (rows["layer"].between(1, layers).all() and rows["head"].between(1, heads).all()):
            raise InputError(f"{what}: {HEADS} names a {kind} head outside the model's {layers} layers of {heads}")
        counts[kind] = len(rows)
    for kind, count in counts.items():  # no row twice, each in range: then a count tells a missing one
        layers, heads = sizes[kind]
        if count != layers * heads:
            raise InputError(
                f"{what}: {HEADS} has {count} rows for {kind} heads, not one for each of the model's {layers} "
                f"layers of {heads}"
            )


def _check_statistics(heads: pd.DataFrame) -> None:
    """Refuse an infinite statistic (NaN stands for one a kind of head lacks), on every record's rows at once: one
    pass, not one per record."""
    statistics = heads.columns.drop(list(HEAD_COLUMNS))
    infinite = np.isinf(heads[statistics].to_numpy(np.float64, na_value=np.nan))
    if infinite.any():
        row, column = np.argwhere(infinite)[0]
        record = _record_name(int(heads["step"].iloc[row]))
        raise InputError(f"the history's record {record}: {HEADS} holds an infinite value in {statistics[column]}")


def _check_weights(maps: np.ndarray, name: str, causal: bool, records: Sequence[str]) -> None:
    """Refuse maps (N, L, H, Q, K) no softmax gives, naming the first record that holds them: weights outside 0 to 1
    (NaN too), rows that do not sum to 1, and (``causal``) a weight on a later token. The page would draw them."""
    Q, K = maps.shape[-2:]
    later = np.triu(np.ones((Q, K), dtype=bool), 1)
    faults = (
        ("weights outside 0 to 1", ((maps >= 0) & (maps <= 1)).all(axis=(1, 2, 3, 4))),
        ("rows whose weights do not sum to 1", _rows_sum_to_one(maps)),
        ("weights on later tokens", ~maps[..., later].any(axis=(1, 2, 3)) if causal else None),
    )
    for fault, ok in faults:
        if ok is not None and not ok.all():
            raise InputError(f"the history's record {records[int(np.argmin(ok))]}: {MAPS}'s {name} holds {fault}")


def _rows_sum_to_one(maps: np.ndarray) -> np.ndarray:
    """Per record, whether each row sums to 1 within float16's rounding (summed in float32: float16 would add its
    own error)."""
    return (np.abs(maps.sum(-1, dtype=np.float32) - 1) <= ROW_SUM_TOLERANCE).all(axis=(1, 2, 3))


def load_history(folder: str | Path) -> History:
    """The history in ``folder`` (a training's --out, or its history/ folder), every record stacked by step.

    Half-written records (temporary folders of a killed run) are ignored. Raises
    [`InputError`][attnviz.errors.InputError] for a folder with no history, a record that is
    incomplete or corrupt, a file over its bound, or a history written by a newer attnviz.
    """
    folder = _find(path_argument("folder", folder, "a training's --out folder or its history folder"))
    manifest = _read_manifest(folder)
    kind, sites = manifest["kind"], SITES[manifest["kind"]]
    names = sorted(p.name for p in (folder / RECORDS).iterdir() if RECORD_NAME.match(p.name))
    if not names:
        empty = "holds no record yet: train with --history-every N"
        raise InputError(f"the history in {folder} {empty}", public=f"the model's training history {empty}")
    if len(names) > MAX_RECORDS:  # first: what follows is bounded by it
        raise InputError(f"the history holds {len(names):,} records, over the limit of {MAX_RECORDS:,}")
    steps = Counter(int(n) for n in names)
    if len(steps) != len(names):  # 00000400 and 000000400: two records of one step
        step = min(step for step, count in steps.items() if count > 1)
        raise InputError(f"the history holds two records of step {step}; a step has one record")
    expected = {
        f"p{p}_{site}": tuple(probe["shapes"][site]) for p, probe in enumerate(manifest["probes"]) for site in sites
    }
    budget, rows_left = max_export_bytes(), MAX_HISTORY_ROWS
    losses, heads, maps = [], [], []
    records = sorted(names, key=int)
    for name in records:
        record = folder / RECORDS / name
        what = f"the history's record {name}"
        if record.is_symlink() or not record.is_dir():
            raise InputError(f"{what} is not a folder")
        loss = _read_table(record, LOSSES, LOSS_COLUMNS, what)
        if loss["step"].dtype.kind not in "iu":
            raise InputError(f"{what}: {LOSSES} numbers its step with other values than a whole number")
        if len(loss) != 1 or int(loss["step"].iloc[0]) != int(name):
            raise InputError(f"{what}: {LOSSES} must hold one row, of step {int(name)}")
        if not np.isfinite(loss[list(LOSS_COLUMNS)].to_numpy(np.float64)).all():  # a training stops before that
            raise InputError(f"{what}: {LOSSES} holds a NaN or infinite loss or learning rate")
        if rows_left < MAX_HEAD_ROWS:  # the history is read whole: its records' rows are bounded together
            over = f"the {rows_left:,} left of the {MAX_HISTORY_ROWS:,} head rows a history may hold in all"
            table = _read_table(record, HEADS, HEAD_COLUMNS, what, rows_left, over)
        else:
            table = _read_table(record, HEADS, HEAD_COLUMNS, what)
        rows_left -= len(table)
        if len(table) and (table["step"] != int(name)).any():
            raise InputError(f"{what}: {HEADS} holds rows of another step")
        sizes = {site: expected[f"p0_{site}"][:2] for site in sites}  # (layers, heads) of each kind
        _check_heads(table, sizes, manifest.get("statistics") or (), what)
        arrays, size = _read_maps(record, expected, budget, what)
        budget -= size
        losses.append(loss)
        heads.append(table)
        maps.append(arrays)
    loss = pd.concat(losses, ignore_index=True)
    table = pd.concat(heads, ignore_index=True)
    _check_statistics(table)
    stacked = {name: np.stack([m[name] for m in maps]) for name in expected}
    for name, array in stacked.items():  # on the stacked maps: one pass over each probe's site, not one per record
        _check_weights(array, name, name.endswith(f"_{CAUSAL_SITE}"), records)
    probes = [
        Probe(
            text=probe["text"],
            target=probe["target"],
            src_tokens=probe["src_tokens"],
            tgt_tokens=probe["tgt_tokens"],
            maps={site: stacked[f"p{p}_{site}"] for site in sites},
        )
        for p, probe in enumerate(manifest["probes"])
    ]
    return History(
        folder=folder,
        kind=kind,
        task=manifest["task"],
        step=loss["step"].to_numpy(np.int64),
        train_loss=loss["train_loss"].to_numpy(np.float64),
        heldout_loss=loss["heldout_loss"].to_numpy(np.float64),
        lr=loss["lr"].to_numpy(np.float64),
        heads=table,
        probes=probes,
        manifest=manifest,
    )
