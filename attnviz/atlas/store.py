"""An atlas folder: shards written as the work proceeds, resumed on a re-run, then the final tables.

Layout of a folder (README, "Head atlas"): ``manifest.json`` from the start (``complete`` false
until the end); while running, ``shards/NNNNN.{inputs,pairs,sentences}.parquet`` per finished
shard, the sentences file written last, so that its presence marks the shard done; at the end
``sentences.parquet``, ``heads.parquet``, ``distances.parquet``, ``mds.parquet`` and
``inputs.parquet``, and the shards are removed. Every file is written under a temporary name and
renamed, so a run killed at any moment leaves no half-written file that counts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.atlas.summary import (
    Atlas,
    distance_table,
    head_table,
    mds_table,
    mean_divergences,
    sort_heads,
    sort_sentences,
)
from attnviz.errors import AtlasError

FORMAT = "attnviz-atlas/1"
MANIFEST = "manifest.json"
TABLES = ("sentences", "heads", "distances", "mds", "inputs")
SHARDS = "shards"


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: dict) -> None:
    _write_atomic(path, lambda p: p.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"))


def write_table(path: Path, frame: pd.DataFrame) -> None:
    _write_atomic(path, lambda p: frame.to_parquet(p, index=False))


class AtlasFolder:
    """A folder an atlas is written into, shard by shard; a second run with the same plan resumes it.

    ``plan`` holds everything the results depend on (model and corpus hashes, limit, precision,
    shard size): a folder written under another plan is refused, never mixed with.
    """

    def __init__(self, folder: Path, plan: dict, manifest: dict):
        self.folder = Path(folder)
        self.shards = self.folder / SHARDS
        existing = self.folder / MANIFEST
        if existing.is_file():
            before = read_manifest(self.folder)
            if before.get("plan") != plan:
                changed = sorted(k for k in {*plan, *before.get("plan", {})} if plan.get(k) != before["plan"].get(k))
                raise AtlasError(
                    f"{self.folder} holds an atlas of another model, corpus or settings (differs in: "
                    f"{', '.join(changed)}); choose another --out folder or remove that one"
                )
            self.manifest = {**before, "runs": before.get("runs", []) + manifest.get("runs", [])}
        elif self.folder.exists() and any(self.folder.iterdir()):
            raise AtlasError(f"{self.folder} is not empty and holds no atlas: choose an empty or new --out folder")
        else:
            self.manifest = {"format": FORMAT, "complete": False, "plan": plan, **manifest}
        self.shards.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / MANIFEST, self.manifest)

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def _shard(self, index: int, part: str) -> Path:
        return self.shards / f"{index:05d}.{part}.parquet"

    def done(self) -> set[int]:
        """The shards already written."""
        return {int(p.name.split(".")[0]) for p in self.shards.glob("*.sentences.parquet")}

    def write_shard(self, index: int, sentences: pd.DataFrame, inputs: pd.DataFrame, sums: dict) -> None:
        """One finished shard: its inputs and divergence sums first, its sentences last (the mark of done)."""
        pairs = [
            pd.DataFrame({"kind": kind, "pair": np.arange(total.size), "js_sum": total.ravel(), "count": count})
            for kind, (total, count) in sums.items()
        ]
        write_table(self._shard(index, "inputs"), inputs)
        write_table(self._shard(index, "pairs"), pd.concat(pairs, ignore_index=True))
        write_table(self._shard(index, "sentences"), sentences)

    def finish(self, n_shards: int, n_heads: int, updates: dict) -> Atlas:
        """Merge the shards into the final tables, mark the manifest complete, remove the shards."""
        missing = sorted(set(range(n_shards)) - self.done())
        if missing:
            raise AtlasError(f"shards {missing} are missing from {self.folder}: run the same command again")
        indices = range(n_shards)
        sentences = sort_sentences(pd.concat([pd.read_parquet(self._shard(i, "sentences")) for i in indices]))
        inputs = pd.concat([pd.read_parquet(self._shard(i, "inputs")) for i in indices])
        inputs = inputs.sort_values("line").reset_index(drop=True)
        sums: dict[str, tuple[np.ndarray, int]] = {}
        for i in indices:  # in shard order: the same sums, to the last bit, however often the run stopped
            pairs = pd.read_parquet(self._shard(i, "pairs"))
            for kind, rows in pairs.groupby("kind", sort=False):
                total = rows.sort_values("pair")["js_sum"].to_numpy()
                size = int(round(np.sqrt(total.size)))
                count = int(rows["count"].iloc[0])
                before, seen = sums.get(kind, (np.zeros((size, size)), 0))
                sums[kind] = (before + total.reshape(size, size), seen + count)
        atlas = summarise(sentences, inputs, sums, n_heads, {**self.manifest, **updates, "complete": True})
        for name in TABLES:
            write_table(self.folder / f"{name}.parquet", getattr(atlas, name))
        write_json(self.folder / MANIFEST, atlas.manifest)
        shutil.rmtree(self.shards)
        self.manifest = atlas.manifest
        return atlas


def summarise(
    sentences: pd.DataFrame, inputs: pd.DataFrame, sums: dict[str, tuple[np.ndarray, int]], n_heads: int, manifest: dict
) -> Atlas:
    """The whole atlas from the per-sentence rows and the divergence sums."""
    means = mean_divergences(sums)
    return Atlas(
        sentences=sort_sentences(sentences),
        heads=sort_heads(head_table(sentences)),
        distances=distance_table(means, n_heads),
        mds=mds_table(means, n_heads),
        inputs=inputs.sort_values("line").reset_index(drop=True),
        manifest=manifest,
    )


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AtlasError("no atlas there: manifest.json is missing (`attnviz atlas --out` writes one)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AtlasError(f"the atlas's manifest.json cannot be read: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise AtlasError(f"manifest.json is not an attnviz atlas manifest (format {FORMAT})")
    return manifest


def load_atlas(folder: str | Path) -> Atlas:
    """Read a finished atlas folder; AtlasError (naming no path) when it is incomplete or not an atlas."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if not manifest.get("complete"):
        raise AtlasError("this atlas is not finished: run the same `attnviz atlas` command again to complete it")
    tables = {}
    for name in TABLES:
        try:
            tables[name] = pd.read_parquet(folder / f"{name}.parquet")
        except FileNotFoundError:
            raise AtlasError(f"the atlas has no {name}.parquet: it is incomplete; compute it again") from None
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own errors for a damaged file
            raise AtlasError(
                f"the atlas's {name}.parquet cannot be read ({type(e).__name__}); compute it again"
            ) from None
    return Atlas(manifest=manifest, **tables)
