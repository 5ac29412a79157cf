"""An atlas folder: shards written as the work proceeds, resumed on a re-run, then the final tables.

Layout of a folder (docs/atlas.md): ``manifest.json`` from the start (``complete`` false
until the end); while running, ``shards/NNNNN.{inputs,pairs,sentences}.parquet`` per finished
shard, then ``shards/NNNNN.record.json`` (each file's rows and SHA-256), whose presence marks the
shard done: one small file per shard, so that writing a shard costs the same whatever the corpus's
size (a ledger in the manifest would grow with it, and be written again after every shard); at the end
``sentences.parquet``, ``heads.parquet``, ``distances.parquet``, ``mds.parquet`` and
``inputs.parquet``, and the shards are removed. Every file is written under a temporary name and
renamed, so a run killed at any moment leaves no half-written file that counts.

The merge holds one chunk of the corpus at a time (`attnviz.atlas.corpus.read_chunks`: consecutive
lines, so its rows sorted are the next rows of the final tables): ``sentences.parquet`` and
``inputs.parquet`` are written a chunk at a time with a ``pyarrow.parquet.ParquetWriter``, the heads'
table from sums that add up over chunks (`attnviz.atlas.summary.add_head_parts`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.atlas.corpus import file_sha256
from attnviz.atlas.stats import STATISTICS
from attnviz.atlas.summary import (
    Atlas,
    add_head_parts,
    distance_table,
    head_parts,
    head_table,
    heads_from_parts,
    mds_table,
    mean_divergences,
    sort_heads,
    sort_sentences,
)
from attnviz.errors import AtlasError, describe
from attnviz.export import path_argument, positive_setting

FORMAT = "attnviz-atlas/1"
MANIFEST = "manifest.json"
TABLES = ("sentences", "heads", "distances", "mds", "inputs")
# The finishing run's record, in the manifest: each final table's SHA-256 and the manifest's own (`intact`)
FINISHED = "finished_sha256"
SHARDS = "shards"
PARTS = ("inputs", "pairs", "sentences")  # a shard's files, in the order they are written
RECORD = "record.json"  # a shard's record, written after its files: each file's rows and sha256
MAX_RECORD_BYTES = 1 << 16

log = logging.getLogger(__name__)


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    _write_atomic(path, lambda p: p.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"))


def write_table(path: Path, frame: pd.DataFrame) -> None:
    _write_atomic(path, lambda p: frame.to_parquet(p, index=False))


class _TableWriter:
    """A Parquet file written a part at a time under a temporary name, renamed by `close`: every part
    takes the first part's schema (pandas' column types included), so the file reads back as one table."""

    def __init__(self, path: Path):
        self.path, self.tmp, self.writer = path, path.with_name(path.name + ".tmp"), None

    def write(self, frame: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.writer is None:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            self.writer = pq.ParquetWriter(self.tmp, table.schema)
        else:
            table = pa.Table.from_pandas(frame, schema=self.writer.schema, preserve_index=False)
        self.writer.write_table(table)

    def close(self) -> None:
        self.writer.close()
        os.replace(self.tmp, self.path)


def _lock(folder: Path) -> int:
    """The folder, made if need be, locked for this run (an open descriptor): AtlasError when another
    run holds it. Two runs in one folder would compute the same shards into the same temporary files
    and each rewrite the manifest over the other's. The lock goes with the process (kill -9 included);
    a file system that keeps no locks (some network ones) checks nothing."""
    if folder.exists() and not folder.is_dir():
        raise AtlasError(f"{folder} is a file: name a folder for the atlas")
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AtlasError(
            f"another run is writing the atlas in {folder}: wait for it to end, or choose another --out folder"
        ) from None
    except OSError:  # no locks there: nothing to hold
        pass
    return fd


class AtlasFolder:
    """A folder an atlas is written into, shard by shard; a second run with the same plan resumes it.

    ``plan`` holds everything the results depend on (model and corpus hashes, limit, precision,
    shard size): a folder written under another plan is refused, never mixed with. A folder marked
    finished is trusted only when `load_atlas` reads it back: without its five tables, or with tables damaged or
    disagreeing with each other or with the manifest, it is computed again. This run joins
    the manifest's ``runs`` when it writes into the folder (a folder it begins, a shard, the final
    tables), not when it finds the atlas finished.
    """

    def __init__(self, folder: Path, plan: dict, manifest: dict):
        self.folder = Path(folder)
        self._lock = _lock(self.folder)
        try:
            self._open(plan, manifest)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let another run into the folder (a run that ends, however it ends, lets it in by itself)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> AtlasFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, plan: dict, manifest: dict) -> None:
        self.shards = self.folder / SHARDS
        self.run = manifest.get("runs", [])
        existing = self.folder / MANIFEST
        if existing.is_file():
            before = read_manifest(self.folder)
            for field, kind, default in (("plan", dict, None), ("runs", list, [])):
                if not isinstance(before.get(field, default), kind):  # read below as what it should be
                    raise AtlasError(
                        f"{self.folder} holds an atlas whose manifest.json is damaged (its {field} is "
                        f"{describe(before.get(field))}): remove that folder or choose another --out folder"
                    )
            if "unknown" not in before["plan"]:
                before["plan"] = {**before["plan"], "unknown": "kept"}  # what attnviz did before it could skip them
            if before.get("plan") != plan:
                changed = sorted(k for k in {*plan, *before.get("plan", {})} if plan.get(k) != before["plan"].get(k))
                if changed == ["unknown"]:
                    kept = before["plan"]["unknown"] == "kept"
                    raise AtlasError(
                        f"{self.folder} holds an atlas that {'kept' if kept else 'skipped'} the lines with characters "
                        f"the model's tokenizer cannot read: {'add' if kept else 'leave out'} --allow-unknown to "
                        "resume or read it, or choose another --out folder"
                    )
                if "chunk_lines" in changed and "chunk_lines" not in before.get("plan", {}):
                    raise AtlasError(
                        f"{self.folder} holds an atlas written by an older attnviz, which read the corpus whole: "
                        "choose another --out folder or remove that one"
                    )
                raise AtlasError(
                    f"{self.folder} holds an atlas of another model, corpus or settings (differs in: "
                    f"{', '.join(changed)}); choose another --out folder or remove that one"
                )
            self.manifest, self.run_added = before, False
            if self.complete:
                self._check_finished()
        elif self.folder.exists() and any(self.folder.iterdir()):
            raise AtlasError(f"{self.folder} is not empty and holds no atlas: choose an empty or new --out folder")
        else:
            self.manifest, self.run_added = {"format": FORMAT, "complete": False, "plan": plan, **manifest}, True
        if not self.complete:
            # A link would have this run read another folder's shards as its own and write into it; a file in
            # its place had failed on mkdir with an errno
            if self.shards.is_symlink() or (self.shards.exists() and not self.shards.is_dir()):
                raise AtlasError(
                    f"{self.folder} holds an atlas whose {SHARDS} is not a folder of its own: remove that folder or "
                    "choose another --out folder"
                )
            self.shards.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / MANIFEST, self.manifest)

    def _check_finished(self) -> None:
        """A folder marked finished: refused when its manifest cannot be read as a finished atlas's, marked
        unfinished (to be computed again, with a warning) when a table is missing or `load_atlas` refuses the
        atlas: a table truncated or forged, or tables that disagree with each other or with the manifest's counts
        (`attnviz.atlas.summary.Atlas`). An atlas whose files are as its finishing run wrote them (`intact`) is not
        read back; reading one back computes nothing, and holds the atlas in memory, as every reader of it does
        (its tables are bounded by ``ATTNVIZ_MAX_ATLAS_ROWS``)."""
        try:
            check_finished_manifest(self.manifest)
        except AtlasError as e:
            raise AtlasError(
                f"{self.folder} holds a finished atlas that cannot be read ({e}): remove that folder or choose another "
                "--out folder"
            ) from None
        missing = [f"{name}.parquet" for name in TABLES if not (self.folder / f"{name}.parquet").is_file()]
        if missing:
            log.warning("%s is marked finished but lacks %s: it is computed again", self.folder, ", ".join(missing))
            self.manifest = {**self.manifest, "complete": False}
            return
        try:
            check_finished(self.folder, self.manifest)
        except AtlasError as e:
            log.warning("%s is marked finished but cannot be read (%s): it is computed again", self.folder, e)
            self.manifest = {**self.manifest, "complete": False}

    def _add_run(self) -> None:
        """This run among the manifest's runs, once, as it first writes into the folder."""
        if not self.run_added:
            self.manifest = {**self.manifest, "runs": [*self.manifest.get("runs", []), *self.run]}
            self.run_added = True
            write_json(self.folder / MANIFEST, self.manifest)

    @property
    def complete(self) -> bool:
        return self.manifest.get("complete") is True  # not "false", nor NaN, which are true to bool()

    def _shard(self, index: int, part: str) -> Path:
        return self.shards / f"{index:05d}.{part}.parquet"

    def _record(self, index: int) -> Path:
        return self.shards / f"{index:05d}.{RECORD}"

    def _read_record(self, index: int) -> dict | None:
        """Shard ``index``'s record (its files' rows and hashes), None when there is none or it cannot be read."""
        path = self._record(index)
        try:
            if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
                return None
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # ValueError: JSONDecodeError, an integer of 4,300 digits
            return None
        well_formed = isinstance(record, dict) and all(
            isinstance(record.get(part), dict)
            and type(record[part].get("rows")) is int
            and isinstance(record[part].get("sha256"), str)
            for part in PARTS
        )
        return record if well_formed else None

    def _matches(self, index: int, sentences: int | None) -> str | None:
        """Why shard ``index`` does not match its record (None when it does, file by file)."""
        record = self._read_record(index)
        if record is None:
            return "it has no readable record"
        # The record names its shard: a shard's files and record copied under another number (or a record from
        # an attnviz before it named them) match their hashes, yet would merge one shard's lines twice
        # and another's not at all
        if type(record.get("index")) is not int or record["index"] != index:
            return "its record is not this shard's"
        if sentences is not None and record["inputs"]["rows"] != sentences:
            return f"it holds {record['inputs']['rows']} sentences where the plan has {sentences}"
        for part in PARTS:
            path = self._shard(index, part)
            if not path.is_file():
                return f"its {part} file is missing"
            if file_sha256(path) != record[part]["sha256"]:
                return f"its {part} file changed since it was written"
        return None

    def done(self, sizes: dict[int, int] | None = None) -> set[int]:
        """The shards already written whose files are exactly as recorded when they were (and, with
        ``sizes``, hold the plan's number of sentences). Any other shard's files are removed, with a
        warning, so that it is computed again: a shard is never merged on trust."""
        found = {  # ASCII digits: "²" is a digit to isdigit() but not to int()
            int(p.name[:5])
            for p in self.shards.iterdir()
            if p.name[:5].isascii() and p.name[:5].isdigit() and p.name[5:6] == "."
        }
        good = set()
        for index in sorted(found):
            why = self._matches(index, None if sizes is None else sizes.get(index))
            if why is None:
                good.add(index)
                continue
            log.warning("shard %d of %s is computed again: %s", index, self.folder, why)
            for part in PARTS:
                self._shard(index, part).unlink(missing_ok=True)
            self._record(index).unlink(missing_ok=True)
        return good

    def write_shard(self, index: int, sentences: pd.DataFrame, inputs: pd.DataFrame, sums: dict) -> None:
        """One finished shard: its three files, then their rows and hashes in its record (the mark of done)."""
        self._add_run()
        pairs = pd.concat(
            [
                pd.DataFrame({"kind": kind, "pair": np.arange(total.size), "js_sum": total.ravel(), "count": count})
                for kind, (total, count) in sums.items()
            ],
            ignore_index=True,
        )
        record: dict = {"index": index}  # which shard it is: see `_matches`
        for part, frame in zip(PARTS, (inputs, pairs, sentences), strict=True):
            write_table(self._shard(index, part), frame)
            record[part] = {"rows": len(frame), "sha256": file_sha256(self._shard(index, part))}
        write_json(self._record(index), record)

    def finish(self, chunks: list[list[int]], n_heads: int, updates: dict, roles: pd.DataFrame | None = None) -> dict:
        """Check every shard against its record, merge them into the final tables chunk by chunk
        (``chunks``: the shard numbers of each chunk of the corpus, in corpus order), mark the manifest
        complete, remove the shards; the finished manifest. A shard that no longer matches is
        refused: never merged."""
        self._add_run()
        n_shards = sum(len(chunk) for chunk in chunks)
        for index in range(n_shards):
            why = self._matches(index, None)
            if why is not None:
                raise AtlasError(
                    f"shard {index} of {self.folder} cannot be merged: {why}; run the same command again to compute it"
                )
        tables = {name: _TableWriter(self.folder / f"{name}.parquet") for name in ("sentences", "inputs")}
        parts = None
        for chunk in chunks:  # consecutive lines: sorted, the next rows of the final tables
            if not chunk:
                continue
            sentences = sort_sentences(pd.concat([pd.read_parquet(self._shard(i, "sentences")) for i in chunk]))
            parts = add_head_parts(parts, head_parts(sentences))
            tables["sentences"].write(sentences)
            del sentences
            inputs = pd.concat([pd.read_parquet(self._shard(i, "inputs")) for i in chunk])
            tables["inputs"].write(inputs.sort_values("line").reset_index(drop=True))
            del inputs
        sums: dict[str, tuple[np.ndarray, int]] = {}
        for i in range(n_shards):  # in shard order: the same sums, to the last bit, however often the run stopped
            pairs = pd.read_parquet(self._shard(i, "pairs"))
            for kind, rows in pairs.groupby("kind", sort=False):
                total = rows.sort_values("pair")["js_sum"].to_numpy()
                size = int(round(np.sqrt(total.size)))
                count = int(rows["count"].iloc[0])
                before, seen = sums.get(kind, (np.zeros((size, size)), 0))
                sums[kind] = (before + total.reshape(size, size), seen + count)
        heads = heads_from_parts(parts)
        if roles is not None:
            heads = heads.merge(roles, on=["kind", "layer", "head"], how="left")
        means = mean_divergences(sums)
        small = {"heads": sort_heads(heads), "distances": distance_table(means, n_heads)}
        for name, frame in {**small, "mds": mds_table(means, n_heads)}.items():
            write_table(self.folder / f"{name}.parquet", frame)
        for writer in tables.values():
            writer.close()
        manifest = {**self.manifest, **updates, "complete": True}
        written = {name: file_sha256(self.folder / f"{name}.parquet") for name in TABLES}  # see `intact`
        self.manifest = {**manifest, FINISHED: {**written, MANIFEST: _manifest_sha256(manifest)}}
        write_json(self.folder / MANIFEST, self.manifest)
        shutil.rmtree(self.shards)
        return self.manifest


def summarise(
    sentences: pd.DataFrame,
    inputs: pd.DataFrame,
    sums: dict[str, tuple[np.ndarray, int]],
    n_heads: int,
    manifest: dict,
    roles: pd.DataFrame | None = None,
) -> Atlas:
    """The whole atlas from the per-sentence rows and the divergence sums; ``roles`` (a language model's
    `attnviz.atlas.roles.role_table`) adds its columns to the heads' table."""
    means = mean_divergences(sums)
    heads = head_table(sentences)
    if roles is not None:
        heads = heads.merge(roles, on=["kind", "layer", "head"], how="left")
    return Atlas(
        sentences=sort_sentences(sentences),
        heads=sort_heads(heads),
        distances=distance_table(means, n_heads),
        mds=mds_table(means, n_heads),
        inputs=inputs.sort_values("line").reset_index(drop=True),
        manifest=manifest,
    )


MAX_MANIFEST_BYTES = 1 << 20
MAX_ATLAS_MB = 256  # per table file; ATTNVIZ_MAX_ATLAS_MB changes it
MAX_ATLAS_ROWS = 2_000_000  # per table, read from the file's metadata first; ATTNVIZ_MAX_ATLAS_ROWS changes it
LIST_VALUES_PER_ROW = 16  # values of one column (a list column's tokens, all rows) per row of that limit
# The types of the columns the app and the CLI read (pandas' categories of strings are text too); every other
# column of COLUMNS, and each statistic of the heads' table, holds numbers. Lists (src_ids, ...) are not checked.
TEXT_COLUMNS = frozenset({"kind", "src"})
WHOLE_COLUMNS = frozenset({"line", "layer", "head", "layer_a", "head_a", "layer_b", "head_b", "queries", "keys"})
# Statistics every real query row has the key of (attnviz.atlas.stats): never NaN, for a sentence or a head,
# where the others are for a kind (`stats.defined`) or a sentence too short for them
NEVER_NAN = ("entropy", "diagonal", "first", "special", "punctuation", "confidence")
LIST_COLUMNS = frozenset({"src_ids", "src_tokens", "tgt_ids", "tgt_tokens"})
COLUMNS = {  # what each table must hold for the app and the CLI to read it
    "sentences": ("line", "kind", "layer", "head", *STATISTICS),
    "heads": ("kind", "layer", "head", "sentences"),
    "distances": ("kind", "layer_a", "head_a", "layer_b", "head_b", "js_divergence"),
    "mds": ("kind", "layer", "head", "x", "y"),
    "inputs": ("line", "src", "src_ids", "src_tokens", "tgt_ids", "tgt_tokens"),
}


def _limit(name: str, default: int, unit: str) -> float:
    """``default``, or the environment's ``name``: a setting that is not a positive number is an AtlasError."""
    return positive_setting(name, default, unit, AtlasError, "the server's atlas limits are misconfigured")


def max_atlas_rows() -> int:
    """The most rows a table of an atlas may hold: ``ATTNVIZ_MAX_ATLAS_ROWS``, else `MAX_ATLAS_ROWS`."""
    return int(_limit("ATTNVIZ_MAX_ATLAS_ROWS", MAX_ATLAS_ROWS, "rows"))


def _checked_file(folder: Path, name: str, max_bytes: int) -> Path:
    """``folder / name`` when it is a regular file inside the folder and at most ``max_bytes``; else an
    AtlasError naming only ``name``. Checked as checkpoint files are: a link may not leave the
    folder, and a FIFO or a device is never opened (one would hang the reader, the other never end)."""
    path = folder / name
    try:
        if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
            raise AtlasError(f"the atlas's {name} is a link out of its folder: it is not read")
        info = path.stat()
    except FileNotFoundError:
        raise AtlasError(f"the atlas has no {name}: it is incomplete or not an atlas (`attnviz atlas --out`)") from None
    except (OSError, RuntimeError) as e:  # a loop of links, a name too long
        raise AtlasError(f"the atlas's {name} cannot be read ({type(e).__name__})") from None
    if not stat.S_ISREG(info.st_mode):
        raise AtlasError(f"the atlas's {name} is not a regular file")
    if info.st_size > max_bytes:
        raise AtlasError(
            f"the atlas's {name} is {info.st_size / 2**20:,.1f} MB, over the limit of {max_bytes / 2**20:,.0f} MB"
        )
    return path


def _manifest_sha256(manifest: dict) -> str:
    """The SHA-256 of what a finished atlas's manifest says, its runs and its finishing record left out."""
    said = {key: value for key, value in manifest.items() if key not in ("runs", FINISHED)}
    return hashlib.sha256(json.dumps(said, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def intact(folder: Path, manifest: dict) -> bool:
    """Whether the finished atlas in ``folder`` is, byte for byte, what the run that finished it wrote: each table's
    SHA-256, and the manifest's own, are those ``manifest`` recorded then (`AtlasFolder.finish`). Read a megabyte at
    a time: a rerun of a finished command, which had read the whole atlas back to know it finished (tables of several
    GB for a lab's million lines, far past the driver's bound), knows it so in bounded memory. False for an atlas
    that recorded none (an attnviz before it), and for a table or a count changed, or a table gone or not a regular
    file of the folder: its readers check it whole (`load_atlas`)."""
    written = manifest.get(FINISHED)
    if not isinstance(written, dict) or set(written) != {*TABLES, MANIFEST}:
        return False
    if written[MANIFEST] != _manifest_sha256(manifest):
        return False
    for name in TABLES:
        try:
            path = _checked_file(Path(folder), f"{name}.parquet", 1 << 62)  # its size is its readers' to bound
            if not isinstance(written[name], str) or file_sha256(path) != written[name]:
                return False
        except (AtlasError, OSError):
            return False
    return True


def check_finished(folder: Path, manifest: dict) -> None:
    """AtlasError unless the finished atlas in ``folder`` is as its finishing run wrote it (`intact`, in bounded
    memory) or else `load_atlas` reads it back whole, as every reader reads it: each table's metadata alone had
    passed tables cut short or edited that no longer agree, refused by every reader."""
    if not intact(folder, manifest):
        load_atlas(folder)


def read_manifest(folder: Path) -> dict:
    if not (Path(folder) / MANIFEST).exists() and not (Path(folder) / MANIFEST).is_symlink():
        raise AtlasError("no atlas there: manifest.json is missing (`attnviz atlas --out` writes one)")
    path = _checked_file(Path(folder), MANIFEST, MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, an integer of 4,300 digits
        raise AtlasError(f"the atlas's manifest.json cannot be read ({type(e).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AtlasError(f"manifest.json is not an attnviz atlas manifest (format {FORMAT})")
    return manifest


def check_finished_manifest(manifest: dict) -> None:
    """The fields a finished atlas's readers use, of the types they use: else an AtlasError."""
    model, counts = manifest.get("model"), manifest.get("counts")
    fields = {
        "model.name": isinstance(model, dict) and isinstance(model.get("name"), str),
        "model.checkpoint_sha256": isinstance(model, dict) and isinstance(model.get("checkpoint_sha256"), str),
        "counts.lines": isinstance(counts, dict) and type(counts.get("lines")) is int,
        "counts.sentences": isinstance(counts, dict) and type(counts.get("sentences")) is int,
        "counts.skipped": isinstance(counts, dict)
        and isinstance(counts.get("skipped"), dict)
        and all(type(v) is int for v in counts["skipped"].values()),
        "tgt_from": isinstance(manifest.get("tgt_from"), str),
        "precision": isinstance(manifest.get("precision"), str),
        "statistics": isinstance(manifest.get("statistics"), list)
        and all(isinstance(s, str) for s in manifest["statistics"]),
    }
    wrong = [name for name, ok in fields.items() if not ok]
    if wrong:
        raise AtlasError(f"the atlas's manifest.json lacks, or has the wrong type for: {', '.join(wrong)}")


def _is_text(kind) -> bool:
    """Whether an Arrow type holds text: a string column, or pandas' categories of strings."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _wrong_type(column: str, kind) -> str | None:
    """What ``column`` should hold when its Arrow type ``kind`` does not hold it ("text", "whole numbers",
    "numbers"), else None."""
    import pyarrow as pa

    if column in TEXT_COLUMNS:
        return None if _is_text(kind) else "text"
    if column in WHOLE_COLUMNS:
        return None if pa.types.is_integer(kind) else "whole numbers"
    return None if pa.types.is_integer(kind) or pa.types.is_floating(kind) else "numbers"


def _numbers(manifest: dict, name: str) -> tuple[str, ...]:
    """The columns of table ``name`` that hold numbers besides its `COLUMNS`: the heads' statistics and their
    standard deviations, as the manifest names them."""
    return tuple(f"{s}{std}" for s in manifest["statistics"] for std in ("", "_std")) if name == "heads" else ()


def _read_table(folder: Path, name: str, numbers: tuple[str, ...] = ()) -> pd.DataFrame:
    """One table, after its size, its row count (from the file's own metadata), its columns and their types are
    checked (``numbers``: more columns that, where the table has them, hold numbers)."""
    import pyarrow.parquet as pq

    path = _checked_file(folder, f"{name}.parquet", int(_limit("ATTNVIZ_MAX_ATLAS_MB", MAX_ATLAS_MB, "MB") * 2**20))
    max_rows = max_atlas_rows()
    # A row count bounds no list column (src_ids, ...): a file of a few kilobytes can declare one row of
    # billions of zeros, which pandas would decode whole. LIST_VALUES_PER_ROW values a row at the row limit
    # leaves the longest sentences room; past it, the file is refused before anything is decoded.
    max_values, values = max_rows * LIST_VALUES_PER_ROW, {}
    try:
        meta = pq.ParquetFile(path)
        rows, columns = meta.metadata.num_rows, set(meta.schema_arrow.names)
        if rows > max_rows:
            raise AtlasError(f"the atlas's {name}.parquet has {rows:,} rows, over the limit of {max_rows:,}")
        missing = [c for c in COLUMNS[name] if c not in columns]
        if missing:
            raise AtlasError(f"the atlas's {name}.parquet lacks the columns {', '.join(missing)}: compute it again")
        schema = meta.schema_arrow
        for column in [c for c in (*COLUMNS[name], *numbers) if c in columns and c not in LIST_COLUMNS]:
            if want := _wrong_type(column, schema.field(column).type):  # the pages had failed on a list or a word
                raise AtlasError(
                    f"the atlas's {name}.parquet holds other values than {want} in {column}: compute it again"
                )
        for i in range(meta.metadata.num_row_groups):  # a list column's values, which decode whole, from metadata
            group = meta.metadata.row_group(i)
            for j in range(group.num_columns):
                values[j] = values.get(j, 0) + group.column(j).num_values
        if max(values.values(), default=0) > max_values:
            raise AtlasError(
                f"the atlas's {name}.parquet holds {max(values.values()):,} values in one column, over the limit "
                f"of {max_values:,}: compute it again"
            )
        table = pd.read_parquet(path)
        for column in [c for c in COLUMNS[name] if c in TEXT_COLUMNS | WHOLE_COLUMNS]:
            if table[column].isna().any():
                raise AtlasError(f"the atlas's {name}.parquet has a row with no {column}: compute it again")
        return table
    except AtlasError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own errors for a damaged file
        raise AtlasError(f"the atlas's {name}.parquet cannot be read ({type(e).__name__}); compute it again") from None


def broken_numbers(name: str, table: pd.DataFrame) -> dict[str, np.ndarray]:
    """{column: which rows are broken} of atlas table ``name`` (sentences, heads, distances...): a number that
    is infinite, or missing (NaN) in a statistic never missing (`NEVER_NAN`) of sentences or heads. What
    `load_atlas` refuses, and what the comparisons (`attnviz.testing.atlas`) report."""
    broken = {}
    for column in [c for c in table.columns if c not in LIST_COLUMNS and pd.api.types.is_float_dtype(table[c])]:
        values = table[column].to_numpy(dtype=float, na_value=np.nan)  # pandas' Float64 too
        bad = np.isinf(values)
        if column in NEVER_NAN and name in ("sentences", "heads"):
            bad |= np.isnan(values)
        if bad.any():
            broken[column] = bad
    return broken


def load_atlas(folder: str | Path) -> Atlas:
    """Read a finished atlas folder; AtlasError (naming no path) when it is incomplete, not an atlas,
    or not safe to read: every file is checked as checkpoint files are before any is read whole; an InputError
    when ``folder`` is not text or a path."""
    folder = path_argument("folder", folder, "the atlas's folder")
    manifest = read_manifest(folder)
    if manifest.get("complete") is not True:  # as `AtlasFolder.complete`
        raise AtlasError("this atlas is not finished: run the same `attnviz atlas` command again to complete it")
    check_finished_manifest(manifest)
    atlas = Atlas(manifest=manifest, **{name: _read_table(folder, name, _numbers(manifest, name)) for name in TABLES})
    heads = atlas.heads
    missing = [s for s in manifest["statistics"] if s not in heads.columns or f"{s}_std" not in heads.columns]
    if missing:  # the manifest names what the app's pages draw of each head
        raise AtlasError(f"the atlas's heads.parquet lacks the statistics {', '.join(missing[:4])}: compute it again")
    for name in TABLES:  # numbers the pages would draw as right: no statistic, divergence or place is infinite
        for column in broken_numbers(name, getattr(atlas, name)):
            raise AtlasError(f"the atlas's {name}.parquet has {column} infinite or missing in a row: compute it again")
    lines = atlas.inputs["line"]
    if lines.duplicated().any():  # a sentence counted twice (a shard merged twice) would skew every mean
        raise AtlasError(
            f"the atlas's inputs.parquet has more than one row for line {lines[lines.duplicated()].iloc[0]}: "
            "compute it again"
        )
    twice = heads.duplicated(["kind", "layer", "head"])
    if twice.any():
        kind, layer, head = heads.loc[twice, ["kind", "layer", "head"]].iloc[0]
        raise AtlasError(f"the atlas's heads.parquet has more than one row for {kind} layer {layer} head {head}")
    return atlas
