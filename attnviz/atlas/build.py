"""Build an atlas: into a folder, shard by shard and resumable (the CLI), or in memory (the app).

Both read the same statistics from the same engine function; the folder adds shards, a manifest
and resuming (`attnviz.atlas.store`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.atlas.corpus import (
    Corpus,
    Sentence,
    Survey,
    batch_plan,
    file_sha256,
    read_chunks,
    shards,
    skipped_words,
    survey,
    tokenize,
)
from attnviz.atlas.engine import check_precision, run_local, run_tagged
from attnviz.atlas.roles import PERIOD, PROBES, ROLES, SEED, role_table
from attnviz.atlas.stats import STATISTICS
from attnviz.atlas.store import (
    FORMAT,
    AtlasFolder,
    check_finished,
    check_finished_manifest,
    load_atlas,
    max_atlas_rows,
    read_manifest,
    summarise,
)
from attnviz.atlas.summary import Atlas, add_sums, divergence_sums, inputs_frame, stats_frame
from attnviz.checkpoints import Bundle
from attnviz.errors import AtlasError, InputError, describe
from attnviz.export import maps_bytes, max_export_bytes, package_version, path_argument, size_text

ENGINES = ("local", "ray")
SHARD_SIZE = 512  # sentences per shard: what a killed run loses at most, and how often a shard is written
# Rows of sentences.parquet one chunk of the corpus may make (sentences x heads): what the driver holds
# at once, reading the corpus, sorting it by length and merging the shards. About 200 MB as a table;
# 7,281 lines of the base model (144 heads), 43,690 of `reverse` (24 heads), never fewer than a shard.
CHUNK_ROWS = 2**20
Progress = Callable[[int, int], None]  # (sentences done, sentences in all)


def _versions(engine: str) -> dict[str, str]:
    names = ["attnviz", "torch", "numpy", "pandas", "pyarrow"] + (["ray"] if engine == "ray" else [])
    return {name: package_version(name) for name in names}


def _model(bundle: Bundle) -> dict:
    return {
        "name": bundle.name,
        "family": bundle.info.get("family", "attnviz"),
        "checkpoint_sha256": bundle.sha256,
        "config": bundle.config.to_dict(),
    }


def _tgt_from(bundle: Bundle, given: bool) -> str:
    if bundle.config.encoder_only:
        return "none: encoder-only model"
    if bundle.config.decoder_only:
        return "none: a language model reads each line as its prompt"
    return "given (--targets)" if given else "greedy output of the model"


def _counts(corpus: Corpus | Survey) -> dict:
    n = corpus.sentences if isinstance(corpus, Survey) else len(corpus.sentences)
    return {"lines": corpus.lines, "sentences": n, "skipped": corpus.skipped}


def _check_model(bundle: Bundle, has_targets: bool) -> None:
    if has_targets and (bundle.config.encoder_only or bundle.config.decoder_only):
        kind = "encoder-only" if bundle.config.encoder_only else "a language model"
        raise InputError(f"this model is {kind}: it takes no target sentences; leave out --targets")


def _check_usable(corpus: Corpus | Survey, bundle: Bundle, has_targets: bool) -> None:
    _check_model(bundle, has_targets)
    if not _counts(corpus)["sentences"]:
        reasons = skipped_words(corpus.skipped) or "it is empty"
        raise InputError(f"no usable sentence in the corpus ({corpus.lines} lines: {reasons})")


def heads_per_sentence(bundle: Bundle) -> int:
    """How many heads (rows of ``sentences.parquet``) one sentence gives: every kind's layers x heads."""
    cfg = bundle.config
    return cfg.n_heads * sum(cfg.n_layers_of(kind) for kind in ("encoder", "decoder", "cross"))


def _maps_weight(bundle: Bundle, has_targets: bool) -> Callable:
    """A sentence's maps' size in bytes, as an export (and a batch) holds them."""
    cfg = bundle.config
    return lambda s: maps_bytes(cfg, len(s.src_ids), len(s.tgt_ids) if has_targets else None)


def _check_size(corpus: Survey, bundle: Bundle) -> None:
    """Refuse, before anything is computed, an atlas whose table would hold more rows than its reader
    takes (``ATTNVIZ_MAX_ATLAS_ROWS``), or a sentence whose maps, which a batch holds at once, would
    take more than an export may hold (``ATTNVIZ_MAX_EXPORT_MB``)."""
    per_sentence = heads_per_sentence(bundle)
    rows = corpus.sentences * per_sentence
    if rows > max_atlas_rows():
        raise InputError(
            f"the corpus has {corpus.sentences:,} usable sentences: with {per_sentence:,} heads each, the atlas "
            f"would hold {rows:,} rows, over the {max_atlas_rows():,} an atlas may hold (ATTNVIZ_MAX_ATLAS_ROWS raises "
            "it); use --limit to read fewer lines"
        )
    size, longest = corpus.heaviest
    if size > max_export_bytes():
        raise InputError(
            f"line {longest.line} of the corpus is {len(longest.src_ids):,} tokens: its maps would take about "
            f"{size_text(size)}, over the {size_text(max_export_bytes())} an export may hold "
            "(ATTNVIZ_MAX_EXPORT_MB raises it); shorten that line or leave it out"
        )


def check_texts(what: str, texts) -> list[str]:
    """``texts`` as a list of texts; an InputError naming ``what`` for one string (list() of it is its
    characters, each taken for a sentence) or anything that is not texts (bytes had been called "too long")."""
    if isinstance(texts, str):
        raise InputError(f"{what} must be a list of texts, not one string: [{texts[:40]!r}]")
    if isinstance(texts, bytes) or not isinstance(texts, Iterable):
        raise InputError(f"{what} must be a list of texts, got {type(texts).__name__}")
    texts = list(texts)
    wrong = [t for t in texts if not isinstance(t, str)][:1]  # a list: None itself may be what is wrong
    if wrong:
        raise InputError(f"{what} must be a list of texts; it holds a {type(wrong[0]).__name__}: {wrong[0]!r:.40}")
    return texts


def _whole(name: str, value, optional: bool = False) -> int | None:
    """``value`` as an int when it is a whole number of 1 or more (or None, when ``optional``); else an InputError
    naming ``name``. "2", 2.5, 0 or True had been taken, and written into the manifest as they were."""
    if value is None and optional:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1:
        return int(value)  # numpy's integers too, which JSON cannot write
    also = " (or None)" if optional else ""
    raise InputError(f"{name} must be a whole number of 1 or more{also}; got {describe(value)}")


def _check_options(allow_unknown, **callbacks) -> None:
    """InputError for an ``allow_unknown`` that is not True or False ("no" is true to ``if``), or a callback that
    is not None or callable (it had failed when the first batch was done)."""
    if not isinstance(allow_unknown, (bool, np.bool_)):
        raise InputError(f"allow_unknown must be True or False; got {describe(allow_unknown)}")
    for name, callback in callbacks.items():
        if callback is not None and not callable(callback):
            raise InputError(f"{name} must be a function (done, total), or None; got {describe(callback)}")


def compute_atlas(
    bundle: Bundle,
    sources: Sequence[str],
    targets: Sequence[str] | None = None,
    batch_size: int = 32,
    precision: str = "fp32",
    progress: Progress | None = None,
    allow_unknown: bool = False,
) -> Atlas:
    """The atlas of a list of sentences, in memory (the app); bad lines skipped and counted in the manifest.

    A line with characters the model's tokenizer cannot read is one of them, unless ``allow_unknown``."""
    batch_size = _whole("batch_size", batch_size)
    _check_options(allow_unknown, progress=progress)
    corpus = tokenize(
        bundle.tokenizer,
        check_texts("sources", sources),
        None if targets is None else check_texts("targets", targets),
        allow_unknown=allow_unknown,
    )
    _check_usable(corpus, bundle, targets is not None)
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, len(corpus.sentences))

    frames, sums, sentences = [], {}, []
    for result in run_local(bundle, corpus.sentences, batch_size, precision, on_batch=step):
        frames.append(stats_frame(result))
        add_sums(sums, divergence_sums(result))
        sentences.extend(result.sentences)
    text = "\n".join(sources).encode("utf-8")
    manifest = {
        "format": FORMAT,
        "complete": True,
        "model": _model(bundle),
        "corpus": {"file": None, "sha256": hashlib.sha256(text).hexdigest(), "lines": corpus.lines},
        "tgt_from": _tgt_from(bundle, targets is not None),
        "counts": _counts(corpus),
        "unknown": "kept" if allow_unknown else "skipped",
        "engine": "local",
        "precision": precision,
        "device": str(bundle.device),
        "batch": batch_size,
        "statistics": list(STATISTICS),
        "versions": _versions("local"),
    }
    roles, manifest["roles"] = _roles(bundle)
    return summarise(
        pd.concat(frames, ignore_index=True), inputs_frame(sentences), sums, bundle.config.n_heads, manifest, roles
    )


def _roles(bundle: Bundle) -> tuple[pd.DataFrame | None, dict | None]:
    """A language model's head roles on the repeated-random-tokens probe, and how they were measured."""
    if not bundle.config.decoder_only:
        return None, None
    how = {"probe": "repeated random tokens (Olsson et al., 2022)", "probes": PROBES, "period": PERIOD, "seed": SEED}
    return role_table(bundle), {**how, "columns": list(ROLES)}


def build_atlas(
    bundle: Bundle,
    corpus: str | Path,
    out: str | Path,
    targets: str | Path | None = None,
    batch_size: int = 32,
    precision: str = "fp32",
    engine: str = "local",
    limit: int | None = None,
    shard_size: int = SHARD_SIZE,
    progress: Progress | None = None,
    ray_device: str | None = None,
    chunk_lines: int | None = None,
    allow_unknown: bool = False,
) -> Atlas:
    """The atlas of a corpus file (one sentence per line) written to the folder ``out``, resuming what
    is there, then read back whole (`write_atlas` writes it without reading it back).

    ``targets`` (one decoder input per line) replaces the model's greedy output; ``limit`` reads
    the first lines only; ``allow_unknown`` keeps lines with characters the tokenizer cannot read.
    Shards already in ``out`` from an interrupted run with the same plan are kept; a finished atlas
    is read back without computing anything (one marked finished whose tables are gone, damaged or
    disagree with each other is computed again). The Ray engine's actors run on ``ray_device`` (auto,
    cpu or cuda: default, the bundle's device), wherever the cluster has it.
    """
    write_atlas(
        bundle,
        corpus,
        out,
        targets,
        batch_size,
        precision,
        engine,
        limit,
        shard_size,
        progress,
        ray_device,
        chunk_lines,
        allow_unknown=allow_unknown,
    )
    return load_atlas(out)


def _finished(out: Path, plan: Callable[[], dict]) -> dict | None:
    """The manifest of the finished atlas in ``out``, when it was made under this run's ``plan()`` and its tables
    are as its finishing run wrote them, or else `load_atlas` reads it back whole (`store.check_finished`): a
    rerun of a finished command then neither tokenises its corpus again (minutes for a lab's million lines) nor
    joins a cluster. None for anything else (no atlas there, an unfinished one, another plan, one that cannot be
    read), which the run's own checks then answer."""
    try:
        manifest = read_manifest(out)
        if (
            manifest.get("complete") is not True
            or not isinstance(manifest.get("runs", []), list)  # damaged: `AtlasFolder` says so
            or manifest.get("plan") != plan()
        ):
            return None
        check_finished_manifest(manifest)
        check_finished(out, manifest)
        return manifest
    except (AtlasError, OSError):
        return None


def _shard_batches(
    work: Iterable[dict[int, Sequence[Sentence]]], batch_size: int
) -> Iterator[tuple[tuple[int, bool], list[Sentence]]]:
    """((shard, whether it is the shard's last batch), batch) for every batch of the shards in ``work``."""
    for shards_to_do in work:
        for index, shard in shards_to_do.items():
            plan = batch_plan(shard, batch_size)
            for n, batch in enumerate(plan, 1):
                yield (index, n == len(plan)), batch


def write_atlas(
    bundle: Bundle,
    corpus: str | Path,
    out: str | Path,
    targets: str | Path | None = None,
    batch_size: int = 32,
    precision: str = "fp32",
    engine: str = "local",
    limit: int | None = None,
    shard_size: int = SHARD_SIZE,
    progress: Progress | None = None,
    ray_device: str | None = None,
    chunk_lines: int | None = None,
    reading: Progress | None = None,
    allow_unknown: bool = False,
) -> dict:
    """The finished manifest of the atlas of a corpus file written to the folder ``out`` (as `build_atlas`),
    in memory bounded whatever the corpus's size: the corpus is read ``chunk_lines`` lines at a time
    (default: `CHUNK_ROWS` rows' worth), sorted by length within a chunk and cut into shards there.

    Two passes over the file: the first counts lines, usable sentences and shards and checks sizes
    before any work (``reading(lines read, lines in all)`` follows it: it tokenises the whole corpus);
    the second computes the shards not yet in ``out`` (``progress(sentences done, sentences in all)``).
    A finished atlas of the same plan is read back before either (`_finished`), its corpus read only for its
    hash. On Ray the cluster is joined and its actors planned before the first pass (`ray_engine.connected`),
    and ``out`` is locked for this run from the first write to the end (`store.AtlasFolder`). Every argument
    is checked before anything is read or written.
    """
    corpus = path_argument("corpus", corpus, "the corpus file (one sentence per line)")
    out = path_argument("out", out, "the folder to write the atlas into")
    if targets is not None:
        targets = path_argument("targets", targets, "the file of decoder inputs (one per line), or None")
    batch_size, shard_size = _whole("batch_size", batch_size), _whole("shard_size", shard_size)
    limit, chunk_lines = _whole("limit", limit, optional=True), _whole("chunk_lines", chunk_lines, optional=True)
    _check_options(allow_unknown, progress=progress, reading=reading)
    if not isinstance(engine, str) or engine not in ENGINES:
        raise InputError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    from attnviz.atlas.ray_engine import RAY_DEVICES  # Ray itself is imported only to join a cluster

    if ray_device is not None and (
        not isinstance(ray_device, str) or (engine == "ray" and ray_device not in RAY_DEVICES)
    ):
        # found out on Ray only, once the cluster was joined ("torch.device('cuda')" in its message); the local engine
        # runs on the model's device, and the command line hands it its --device, mps included
        raise InputError(
            f"ray_device must be one of {', '.join(RAY_DEVICES)} (where the Ray engine's actors run), or None for "
            f"the model's own device; got {describe(ray_device)}"
        )
    # On Ray the model runs on the nodes' devices, not the driver's: only the name is checked here
    check_precision(precision, bundle.device if engine == "local" else None)
    _check_model(bundle, targets is not None)
    chunk_lines = chunk_lines or max(shard_size, CHUNK_ROWS // heads_per_sentence(bundle))

    def plan_of() -> dict:  # everything the results depend on: a folder made under another plan is not this run's
        return {
            "checkpoint_sha256": bundle.sha256,
            "corpus_sha256": file_sha256(corpus),
            "targets_sha256": None if targets is None else file_sha256(targets),
            "limit": limit,
            "precision": precision,
            "shard_size": shard_size,
            "chunk_lines": chunk_lines,
            "unknown": "kept" if allow_unknown else "skipped",  # lines with characters the tokenizer cannot read
        }

    if (finished := _finished(out, plan_of)) is not None:
        return finished
    with ExitStack() as stack:
        actors = None
        if engine == "ray":  # joined, and the actors planned, before any reading or writing
            from attnviz.atlas.ray_engine import connected

            actors = stack.enter_context(connected(ray_device or bundle.device.type))
        tokenizer = bundle.tokenizer
        weight = _maps_weight(bundle, targets is not None)
        found = survey(tokenizer, corpus, targets, limit, chunk_lines, shard_size, weight, reading, allow_unknown)
        _check_usable(found, bundle, targets is not None)
        _check_size(found, bundle)
        plan = plan_of()
        sizes = found.shard_sizes
        device = str(bundle.device) if actors is None else actors.device  # on Ray, the nodes'
        run = {"engine": engine, "device": device, "batch": batch_size}
        manifest = {
            "model": _model(bundle),
            "corpus": {"file": corpus.name, "sha256": plan["corpus_sha256"], "lines": found.lines},
            "targets": None if targets is None else {"file": targets.name, "sha256": plan["targets_sha256"]},
            "tgt_from": _tgt_from(bundle, targets is not None),
            "counts": _counts(found),
            "unknown": plan["unknown"],
            "limit": limit,
            "precision": precision,
            "shards": len(sizes),
            "statistics": list(STATISTICS),
            "versions": _versions(engine),
            **run,
            "runs": [run],
        }
        folder = stack.enter_context(AtlasFolder(out, plan, manifest))  # this run's alone until it ends
        if folder.complete:
            return folder.manifest
        done_shards = folder.done(dict(enumerate(sizes)))
        total = found.sentences
        done = sum(sizes[i] for i in done_shards)
        if progress is not None:
            progress(done, total)

        def step(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(done, total)

        def todo() -> Iterator[dict[int, tuple]]:
            """Per chunk, its shards not yet written (the second pass: only one chunk read at a time)."""
            first = 0
            for chunk in read_chunks(tokenizer, corpus, targets, limit, chunk_lines, allow_unknown):
                cut = shards(chunk.sentences, shard_size)
                yield {first + i: shard for i, shard in enumerate(cut) if first + i not in done_shards}
                first += len(cut)

        def write(index: int, results) -> None:
            sums: dict = {}
            for result in results:
                add_sums(sums, divergence_sums(result))
            sentences = [s for result in results for s in result.sentences]
            folder.write_shard(index, pd.concat([stats_frame(r) for r in results]), inputs_frame(sentences), sums)

        if done < total:
            if engine == "local":  # batch after batch across shards: no core idles at a shard's end
                results = []
                for (index, last), result in run_tagged(bundle, _shard_batches(todo(), batch_size), precision, step):
                    results.append(result)
                    if last:
                        write(index, results)
                        results = []
            else:
                from attnviz.atlas.ray_engine import run_ray

                for index, results in run_ray(actors, bundle.path, bundle.sha256, todo(), batch_size, precision, step):
                    write(index, results)
        roles, how = _roles(bundle)
        chunks, first = [], 0
        for chunk in found.chunk_shards:
            chunks.append(list(range(first, first + len(chunk))))
            first += len(chunk)
        return folder.finish(chunks, bundle.config.n_heads, {"counts": _counts(found), "roles": how}, roles)
