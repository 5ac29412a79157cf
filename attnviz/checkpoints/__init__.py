"""Checkpoint directories: attnviz's own, Hugging Face Marian (opus-mt), BERT, GPT-2, Llama and Qwen2.

`IMPORTERS` is the registry, tried in order. An importer is a module with ``FAMILY`` (its
name), ``DESCRIPTION`` (what such a folder holds, for messages), ``detect(path)`` (whether a folder
is of its family, cheaply and without raising), ``probe(path)`` (the model config.json describes,
refused when it cannot run or is over the limits, reading no other file: what a download from the
hub checks before fetching weights) and ``load(path, device)`` (a [`Bundle`][attnviz.checkpoints.Bundle], or a
CheckpointError naming the file and the problem). A new format is one file and one entry here.
"""

from __future__ import annotations

from pathlib import Path

from attnviz.checkpoints import bert, gpt2, llama, marian, native, qwen2
from attnviz.checkpoints.bundle import Bundle
from attnviz.checkpoints.files import one_read, unrecognised
from attnviz.errors import CheckpointError

IMPORTERS = (native, marian, bert, gpt2, llama, qwen2)


def load_checkpoint(path: str | Path, device: str = "auto") -> Bundle:
    """Load a checkpoint directory of any known family onto ``device`` (cpu, cuda, mps or auto), in eval mode."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    with one_read():  # every importer's detect and the load share one parse of config.json
        for importer in IMPORTERS:
            if importer.detect(path):
                return importer.load(path, device)
        raise unrecognised(path, [importer.DESCRIPTION for importer in IMPORTERS])


__all__ = ["IMPORTERS", "Bundle", "load_checkpoint"]
