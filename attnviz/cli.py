"""The `attnviz` command: translate, generate, attention, attribute, atlas, diff, evaluate, train, history. A
stable contract for scripts.

Results go to standard output. `attnviz diff` exits 0 when two exports are equal within the
tolerance and 1 when they differ. Any bad input (an argument out of range, text that is not Unicode,
an output file in a missing folder, a model that cannot be loaded, an output larger than
``ATTNVIZ_MAX_EXPORT_MB``) ends with exit status 2 and one line on standard error,
``attnviz: error: ...``, never a traceback. Arguments are checked as they are parsed, and an
output's size before it is computed. An error attnviz did not foresee (a bug, memory running out)
also gets one line, and exit status 3, which no command uses for an answer; ``ATTNVIZ_DEBUG=1``
shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from attnviz.errors import AttnvizError, InputError
from attnviz.export import DEFAULT_ATOL
from attnviz.startup import imports_kept

if TYPE_CHECKING:
    from attnviz.methods.ablation import Ablation

MAX_PATH = 4096  # Linux's PATH_MAX: a longer --model or --out cannot name a file
MAX_BEAM = 64  # what attnviz.decoding.step_through accepts
MAX_NEW_TOKENS = 256  # what attnviz.api.generate accepts
MAX_POSITION = 1 << 20  # beyond any model's positions; the sentence's own length is checked once it is known
# Exit statuses: 0 done (diff: equal), 1 diff: different, 2 bad input, 3 an error attnviz did not foresee.
EXIT_BAD_INPUT, EXIT_UNFORESEEN = 2, 3


class UsageError(AttnvizError):
    """A command-line argument that cannot be used."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (no usage block) and exit status 2, like attnviz's own."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# ---------------------------------------------------------------------------------------------
# Argument types: each returns the value or raises ArgumentTypeError with a message for people.


def text(value: str) -> str:
    """A text argument that is real Unicode (the shell can pass bytes that decode to nothing)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("the text is not valid UTF-8; pass it in UTF-8") from None
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An integer argument between ``low`` and ``high`` inclusive."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {number}")
        return number

    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """A finite number argument between ``low`` and ``high`` inclusive."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not low <= number <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {value}")
        return number

    return parse


def path_text(value: str) -> str:
    """A path argument: Unicode, not empty, and short enough to name a file."""
    value = text(value)
    if not value:  # pathlib reads "" as ".", the current folder
        raise argparse.ArgumentTypeError("an empty path names no file or folder")
    if len(value.encode("utf-8")) > MAX_PATH or any(len(part.encode("utf-8")) > 255 for part in Path(value).parts):
        raise argparse.ArgumentTypeError(f"the path is too long ({len(value)} characters) to name a file")
    return value


def existing_path(value: str) -> str:
    """A file or folder to read: it must exist."""
    path = Path(path_text(value)).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file or folder: {value!r}")
    return str(path)


def heads(value: str) -> Ablation:
    """Heads to switch off, ``KIND:LAYER.HEAD[,...]`` (from 1); whether the model has them is checked on loading."""
    from attnviz.methods.ablation import Ablation

    try:
        ablation = Ablation.parse(text(value))
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not ablation:
        raise argparse.ArgumentTypeError("name at least one head, e.g. cross:1.2")
    return ablation


def _refuses_files(folder: Path) -> str | None:
    """Why ``folder`` takes no new file (os.strerror's words), or None. A file is made there and removed at once, as
    writing does: os.access answers yes to root for /proc and /sys, whose refusal had come only after the command's
    work, naming its temporary file."""
    if not os.access(folder, os.W_OK):
        return "it is not writable"
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as e:
        return f"a file cannot be made there ({e.strerror or e})"


def out_file(value: str) -> str:
    """A file to write: its folder must exist and be writable, and it must not be a folder itself."""
    path = Path(path_text(value)).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {str(folder)!r} does not exist: create it first")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a folder: name a file in it")
    if value.endswith(("/", os.sep)):  # pathlib drops the slash: "m.npz/" would write the file m.npz
        raise argparse.ArgumentTypeError(f"{value!r} ends in '/', which names a folder: name a file (drop the '/')")
    refused = _refuses_files(folder)
    if refused:
        raise argparse.ArgumentTypeError(f"the folder {str(folder)!r} cannot be written: {refused}")
    return str(path)


def npz_out(value: str) -> str:
    """`out_file`, named ``.npz``: what attention and attribute write is an .npz archive, and any other name
    (``--out model.safetensors`` in the model's own folder) had been overwritten with one."""
    path = out_file(value)  # a folder, a missing folder or a trailing "/" first: each has its own message
    if not path.lower().endswith(".npz"):
        raise argparse.ArgumentTypeError(f"{Path(path).name!r} does not end in .npz: name the .npz file to write")
    return path


def in_file(value: str) -> str:
    """A file to read: it must exist, be a file (not a folder) and be readable."""
    path = Path(path_text(value)).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"there is no file {value!r}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{value!r} is not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{value!r} is not readable")
    return str(path)


def out_dir(value: str) -> str:
    """A folder to write into: an existing writable folder, or a new one whose parent folder exists."""
    path = Path(path_text(value)).expanduser()
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{value!r} is a file: name a folder")
        refused = _refuses_files(path)
        if refused:
            raise argparse.ArgumentTypeError(f"the folder {value!r} cannot be written: {refused}")
        return str(path)
    if path.is_symlink():  # mkdir would fail on it, and a command that writes at its end would fail only then
        raise argparse.ArgumentTypeError(f"{value!r} is a link to {os.readlink(path)!r}, which does not exist")
    parent = path.parent if str(path.parent) else Path(".")
    if parent.is_file():
        raise argparse.ArgumentTypeError(f"{str(parent)!r} is a file, not a folder: name a folder")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {str(parent)!r} does not exist: create it first")
    refused = _refuses_files(parent)
    if refused:
        raise argparse.ArgumentTypeError(f"the folder {str(parent)!r} cannot be written: {refused}")
    return str(path)


# ---------------------------------------------------------------------------------------------
# Commands


class ProgressBar:
    """A progress bar on standard error: redrawn in place on a terminal, a line per tenth otherwise.

    ``after_s``: the bar shows nothing until its work has gone on this long (a pass that ends sooner
    prints nothing, so a refusal that follows it is still the one line on standard error).
    """

    def __init__(self, label: str, stream=None, width: int = 30, unit: str = "sentences", after_s: float = 0.0):
        self.label, self.stream, self.width, self.unit = label, stream or sys.stderr, width, unit
        self.tty = self.stream.isatty()
        self.after_s = after_s
        self.start: float | None = None  # the first call's time: a bar's rate counts its own work only
        self.shown_tenth = -1
        self.shown = self.closed = False

    def __call__(self, done: int, total: int) -> None:
        share = done / total if total else 1.0
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        if not self.shown and now - self.start < self.after_s:
            return
        self.shown = True
        elapsed = max(now - self.start, 1e-9)
        filled = int(share * self.width)
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {self.unit}"
        if self.tty:
            self.stream.write(f"\r{line}, {done / elapsed:.1f}/s ")
        elif int(share * 10) > self.shown_tenth:
            self.shown_tenth = int(share * 10)
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line on a terminal (once, however often it is called)."""
        if self.tty and self.shown and not self.closed:
            self.stream.write("\n")
            self.stream.flush()
        self.closed = True


def _ablation(args) -> Ablation | None:
    """--ablate's heads switched off the way --ablate-mode says, or None without --ablate."""
    from attnviz.methods.ablation import Ablation

    return None if args.ablate is None else Ablation(args.ablate.heads, args.ablate_mode)


# The unknown pieces an error quotes, distinct and in order; the rest are counted.
UNKNOWN_SHOWN = 5


def _check_known(bundle, args, src: str, tgt: str | None = None) -> list[str]:
    """Refuse a text with characters the model's tokenizer cannot read, which the model would see as
    one and the same unknown token. Otherwise the warnings to give once the command has done its work
    (`_warn`; a command that fails says one line, its error): the unknown pieces ``--allow-unknown``
    let through, and why the text looks outside what the model was trained on
    ([`attnviz.api.out_of_domain`][], the app's notice)."""
    from attnviz.api import out_of_domain, unknown_pieces

    warnings = []
    in_source = unknown_pieces(bundle, src)
    unknown = in_source if tgt is None else unknown_pieces(bundle, src, tgt)
    if unknown:
        distinct = list(dict.fromkeys(u.strip() or u for u in unknown))  # a piece's surface may start with a space
        shown = ", ".join(repr(u if len(u) <= 40 else u[:39] + "…") for u in distinct[:UNKNOWN_SHOWN])  # one line
        more = f" and {len(distinct) - UNKNOWN_SHOWN:,} more" if len(distinct) > UNKNOWN_SHOWN else ""
        pieces = "1 piece" if len(unknown) == 1 else f"{len(unknown):,} pieces"
        described = (
            f"characters this model's tokenizer cannot read: {shown}{more} ({pieces}, which the model would read "
            "as its unknown token)"
        )
        if not args.allow_unknown:
            raise InputError(f"the text has {described}; --allow-unknown runs it anyway")
        if not in_source:  # the source's own are in the notice below
            warnings.append(f"the target has {described}")
    notice = out_of_domain(bundle, src)
    return [*warnings, notice] if notice else warnings


def _warn(warnings: list[str]) -> None:
    """`_check_known`'s warnings, each an `attnviz: warning:` line on stderr."""
    for warning in warnings:
        logging.getLogger("attnviz.cli").warning(warning)


def _translate(args) -> None:
    from attnviz.api import load, translate

    bundle = load(args.model, args.device)
    warnings = _check_known(bundle, args, args.text)
    print(translate(bundle, args.text, beam=args.beam, ablate=_ablation(args)))
    _warn(warnings)


def _generate(args) -> None:
    from attnviz.api import generate, load

    model = load(args.model, args.device)
    warnings = _check_known(model, args, args.prompt)
    print(generate(model, args.prompt, max_new=args.max_new, beam=args.beam, ablate=_ablation(args)))
    _warn(warnings)


def _inputs_line(export, unit: str) -> str:
    """What an export's maps are over: "source 7 tokens, decoder input 9 tokens", or a prompt's length."""
    if export.src_tokens is None:  # a language model
        generated = export.manifest.get("generated", 0)
        more = f" with {generated} generated" if generated else ""
        return f"prompt{more}, {len(export.tgt_tokens)} {unit}"
    decoder = "" if export.tgt_tokens is None else f", decoder input {len(export.tgt_tokens)} {unit}"
    return f"source {len(export.src_tokens)} {unit}{decoder}"


def _check_maps_size(bundle, args) -> None:
    """Refuse, before any map is made, a text whose maps would be larger than an export may hold:
    the bound `attention` writes under, and the memory `attribute`'s methods work in (each reads every
    head's map)."""
    from attnviz.api import maps_size
    from attnviz.export import max_export_bytes, size_text

    n, size = maps_size(bundle, args.src, args.tgt, args.generate)
    if size > max_export_bytes():  # a file attnviz's own diff and snapshot plugin would refuse to read
        raise InputError(
            f"the text is {n:,} tokens: its maps would take about {size_text(size)}, over the "
            f"{size_text(max_export_bytes())} an export may hold (ATTNVIZ_MAX_EXPORT_MB raises it); "
            "attnviz.tiled_attention in Python computes any head of it tile by tile"
        )


def _attention(args) -> None:
    from attnviz.api import attention, load

    bundle = load(args.model, args.device)
    _check_maps_size(bundle, args)
    warnings = _check_known(bundle, args, args.src, args.tgt)
    export = attention(bundle, args.src, args.tgt, words=args.words, generate=args.generate)
    path = export.save(args.out)
    L, H = (export.encoder if export.encoder is not None else export.decoder).shape[:2]
    unit = "words" if args.words else "tokens"
    print(f"wrote {path}: {L} layers x {H} heads, {_inputs_line(export, unit)}")
    _warn(warnings)


def _diff(args) -> int:
    import json

    from attnviz.testing.compare import compare_paths

    report = compare_paths(args.a, args.b, atol=args.atol, rtol=args.rtol)
    print(
        json.dumps(report.to_json(), ensure_ascii=False, indent=1, allow_nan=False) if args.json else report.to_text()
    )
    return 0 if report.equal else 1


def _attribute(args) -> None:
    from attnviz.methods import METHODS

    method = METHODS[args.method]
    if args.position is not None and not method.uses_position:
        raise UsageError(f"argument --position: applies to --method grad-attention only, not {args.method}")
    from attnviz.api import attribute, load

    bundle = load(args.model, args.device)
    _check_maps_size(bundle, args)
    warnings = _check_known(bundle, args, args.src, args.tgt)
    export = attribute(
        bundle, args.src, args.tgt, method=args.method, position=args.position, words=args.words, generate=args.generate
    )
    path = export.save(args.out)
    first = export.encoder if export.encoder is not None else export.decoder
    shape = "x".join(str(n) for n in first.shape[: 2 if method.per_head else 1])
    unit = "words" if args.words else "tokens"
    explained = ""
    if "position" in export.manifest:
        token, position = export.manifest["predicted_token"], export.manifest["position"]
        explained = f"; explains {token!r}, predicted at decoder position {position}"
    per = "layers x heads" if method.per_head else "layers"
    print(f"wrote {path}: {method.name}, {shape} ({per}), {_inputs_line(export, unit)}{explained}")
    _warn(warnings)


# The atlas's first pass (tokenising the corpus) shows its bar once it has taken this long: a
# million lines take a while, a small corpus's pass is over at once and shows nothing.
READING_AFTER_S = 2.0


def _atlas(args) -> None:
    from attnviz.api import load
    from attnviz.atlas import heads_per_sentence, write_atlas
    from attnviz.atlas.corpus import skipped_words
    from attnviz.kinds import KINDS

    # On Ray the nodes run the model on --device: this machine only tokenises and writes, on its CPU
    bundle = load(args.model, "cpu" if args.engine == "ray" else args.device)
    reader, bar = ProgressBar("reading", unit="lines", after_s=READING_AFTER_S), ProgressBar("atlas")

    def reading(done: int, total: int) -> None:
        reader(done, total)
        if done == total:
            reader.close()

    try:  # written, not read back: a corpus of any size, in bounded memory
        manifest = write_atlas(
            bundle,
            args.corpus,
            args.out,
            targets=args.targets,
            batch_size=args.batch,
            precision=args.precision,
            engine=args.engine,
            limit=args.limit,
            progress=bar,
            ray_device=args.device,
            reading=reading,
            allow_unknown=args.allow_unknown,
        )
    finally:
        reader.close()
        bar.close()
    counts = manifest["counts"]
    skipped = skipped_words(counts["skipped"]) or "none"
    kinds = [kind for kind in KINDS if bundle.config.n_layers_of(kind)]
    print(
        f"wrote {args.out}: {counts['sentences']} sentences of {counts['lines']} lines (skipped: {skipped}), "
        f"{heads_per_sentence(bundle)} heads ({', '.join(kinds)})"
    )


def _evaluate(args) -> None:
    from attnviz.api import load
    from attnviz.training.data import get_task
    from attnviz.training.seq2seq import exact_match

    bundle = load(args.model, args.device)
    task_name = bundle.info.get("task")
    if not task_name:
        raise AttnvizError(f"model {bundle.name!r} was not trained on a generated task: nothing to evaluate")
    try:
        task = get_task(task_name)
    except InputError as e:  # a config edited by hand, or written by an attnviz with other tasks
        raise InputError(f"model {bundle.name!r} names a task this attnviz cannot evaluate: {e}") from None
    pairs = task.pairs(args.n, args.seed, "heldout")
    unreadable = _check_task_known(bundle, task_name, pairs)
    if bundle.config.decoder_only:  # a language model's card gives its accuracy on the repeated half
        from attnviz.training.lm import repeat_accuracy

        accuracy = repeat_accuracy(bundle.model, bundle.tokenizer, [text for text, _ in pairs])
        print(f"model={bundle.name} task={task_name} n={args.n} seed={args.seed} held-out texts")
        print(f"repeat_accuracy={accuracy:.4f}")
        _warn(unreadable)
        return
    em, misses = exact_match(bundle.model, bundle.tokenizer, pairs)
    for src, ref, out in misses[: args.show_misses]:
        print(f"miss: {src!r} -> {out!r} (expected {ref!r})")
    print(f"model={bundle.name} task={task_name} n={args.n} seed={args.seed} held-out pairs")
    print(f"exact_match={em:.4f}")
    _warn(unreadable)


def _check_task_known(bundle, task_name: str, pairs: list[tuple[str, str]]) -> list[str]:
    """Refuse a task whose held-out text the model's tokenizer mostly cannot read (a config naming another task
    than the model's): each input would be unknown tokens and the score a silent 0. A few pairs with a character
    its tokenizer never saw are the model's own gap, which the score measures: a warning to give after it."""
    from attnviz.api import unknown_pieces

    decoder_only = bundle.config.decoder_only
    unread = [(src, unknown_pieces(bundle, src, None if decoder_only else tgt)) for src, tgt in pairs]
    unread = [(src, pieces) for src, pieces in unread if pieces]
    if not unread:
        return []
    src, pieces = unread[0]
    shown = ", ".join(repr(p) for p in list(dict.fromkeys(pieces))[:UNKNOWN_SHOWN])
    what = (
        f"{len(unread):,} of the {len(pairs):,} held-out pairs of task {task_name!r} have characters model "
        f"{bundle.name!r}'s tokenizer cannot read (the first, {src[:40]!r}: {shown})"
    )
    if 2 * len(unread) > len(pairs):
        raise InputError(f"{what}: the model cannot read its task's text; is it another task's model?")
    return [f"{what}, each read as the unknown token"]


def _train(args) -> None:
    from attnviz.training.loop import train

    train(
        args.task,
        args.out,
        seed=args.seed,
        device=args.device,
        eval_n=args.eval_n,
        steps=args.steps,
        batch_size=args.batch_size,
        lr_scale=args.lr_scale,
        history_every=args.history_every,
        resume=args.resume,
    )


def history_csv(history) -> str:
    """The history's tables as one CSV in long form: a row per step and loss (train_loss, heldout_loss, lr;
    kind, layer and head empty), then a row per step, head and statistic."""
    import pandas as pd

    losses = pd.DataFrame(
        {"step": history.step, "train_loss": history.train_loss, "heldout_loss": history.heldout_loss, "lr": history.lr}
    ).melt(id_vars="step", var_name="statistic", value_name="value")
    heads = history.heads.melt(
        id_vars=["step", "kind", "layer", "head"],
        value_vars=history.statistics,
        var_name="statistic",
        value_name="value",
    )
    table = pd.concat([losses, heads], ignore_index=True)[["step", "kind", "layer", "head", "statistic", "value"]]
    table["layer"], table["head"] = table["layer"].astype("Int64"), table["head"].astype("Int64")
    return table.to_csv(index=False)


def _history(args) -> None:
    import io

    import numpy as np

    from attnviz.export import max_export_bytes, size_text, write_atomically
    from attnviz.training.history import load_history

    history = load_history(args.folder)
    out = Path(args.out)
    if out.suffix.lower() not in (".npz", ".csv"):
        raise InputError(f"--out must end in .npz (the arrays) or .csv (the tables); got {out.name!r}")
    if out.suffix.lower() == ".csv":
        data = history_csv(history).encode("utf-8")
        what = f"{len(history.heads):,} head rows"
    else:
        arrays = history.arrays()
        size = sum(a.nbytes for a in arrays.values())
        if size > max_export_bytes():
            raise InputError(
                f"the history's arrays take {size_text(size)}, over the {size_text(max_export_bytes())} an export "
                "may hold (ATTNVIZ_MAX_EXPORT_MB raises it)"
            )
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        data = buf.getvalue()
        what = f"{len(history.probes)} probes' maps"
    if len(data) > max_export_bytes():
        raise InputError(
            f"the file would be {size_text(len(data))}, over the {size_text(max_export_bytes())} an export may "
            "hold (ATTNVIZ_MAX_EXPORT_MB raises it)"
        )
    write_atomically(out, data)
    steps = history.step
    print(f"wrote {out}: {len(steps)} records (steps {steps[0]} to {steps[-1]}), {what}")


def model_args(p: argparse.ArgumentParser, default_model: str | None = "en-de") -> None:
    """--model and --device, as every command that loads a model takes them."""
    p.add_argument(
        "--model",
        type=path_text,
        default=default_model,
        required=default_model is None,
        help="a shipped model's name (a folder under pretrained/), a checkpoint directory, or a Hugging Face hub id "
        "(owner/name: downloaded into the hub's cache, or read from it with HF_HUB_OFFLINE=1)",
    )
    device_arg(p)


def device_arg(p: argparse.ArgumentParser) -> None:
    """--device, for a command that computes."""
    from attnviz.devices import DEVICE_CHOICES

    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES)


def unknown_arg(p: argparse.ArgumentParser) -> None:
    """--allow-unknown, for a command that reads a text."""
    p.add_argument(
        "--allow-unknown",
        action="store_true",
        help="run on a text with characters the model's tokenizer cannot read (each becomes its unknown token, "
        "labelled <unk:...> in the maps), with a warning, where the command would refuse it",
    )


def words_arg(p: argparse.ArgumentParser) -> None:
    """--words, as every command that writes maps takes it."""
    p.add_argument(
        "--words",
        action="store_true",
        help="merge sub-word pieces into words (attention to a word summed over its pieces, from a word averaged; "
        "Clark et al. 2019): the maps and tokens are words, and the manifest says so",
    )


def generate_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--generate",
        type=int_in(0, MAX_NEW_TOKENS),
        default=0,
        metavar="N",
        help="a language model: append its N greedy tokens to the prompt (default: 0)",
    )


def _translate_arguments(p: argparse.ArgumentParser) -> None:
    from attnviz.methods.ablation import MODES

    model_args(p)
    p.add_argument("--beam", type=int_in(1, MAX_BEAM), default=1, help="beam size (1 = greedy)")
    p.add_argument(
        "--ablate",
        type=heads,
        metavar="KIND:LAYER.HEAD[,...]",
        help="switch these heads off (KIND encoder, decoder or cross; LAYER and HEAD from 1), e.g. cross:1.2,cross:2.1",
    )
    p.add_argument(
        "--ablate-mode",
        choices=MODES,
        default="zero",
        help="zero: " + MODES["zero"] + "; mean: " + MODES["mean"] + " (default: zero)",
    )
    unknown_arg(p)
    p.add_argument("text", type=text)


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    from attnviz.methods.ablation import MODES

    model_args(p)
    p.add_argument(
        "--max-new", type=int_in(0, MAX_NEW_TOKENS), default=20, help="tokens to append at most (default: 20)"
    )
    p.add_argument("--beam", type=int_in(1, MAX_BEAM), default=1, help="beam size (1 = greedy)")
    p.add_argument("--ablate", type=heads, metavar="decoder:LAYER.HEAD[,...]", help="switch these heads off")
    p.add_argument("--ablate-mode", choices=MODES, default="zero", help="zero or mean (default: zero)")
    unknown_arg(p)
    p.add_argument("prompt", type=text)


def _attention_arguments(p: argparse.ArgumentParser) -> None:
    model_args(p)
    p.add_argument("--src", required=True, type=text, help="source sentence, or a language model's prompt")
    p.add_argument(
        "--tgt", type=text, help="target sentence for the decoder input (default: the model's greedy output)"
    )
    generate_arg(p)
    p.add_argument("--out", required=True, type=npz_out, help="output .npz file")
    words_arg(p)
    unknown_arg(p)


def _attribute_arguments(p: argparse.ArgumentParser) -> None:
    from attnviz.methods import METHODS

    model_args(p)
    p.add_argument("--src", required=True, type=text, help="source sentence")
    p.add_argument(
        "--tgt", type=text, help="target sentence for the decoder input (default: the model's greedy output)"
    )
    p.add_argument(
        "--method",
        required=True,
        choices=METHODS,
        help="; ".join(f"{m.name}: {m.title}" for m in METHODS.values()),
    )
    p.add_argument(
        "--position",
        type=int_in(0, MAX_POSITION),
        help="grad-attention: the decoder position (from 0, in pieces) whose predicted token is explained "
        "(default: the last)",
    )
    words_arg(p)
    generate_arg(p)
    p.add_argument("--out", required=True, type=npz_out, help="output .npz file")
    unknown_arg(p)


def _diff_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", type=existing_path, help="the expected export (e.g. a golden file)")
    p.add_argument("b", type=existing_path, help="the actual export")
    p.add_argument(
        "--atol",
        type=float_in(0.0, 1e6),
        default=DEFAULT_ATOL,
        help=f"absolute tolerance per cell (default {DEFAULT_ATOL:g}: what holds across CPUs, docs/tolerances.md)",
    )
    p.add_argument("--rtol", type=float_in(0.0, 1.0), default=0.0, help="relative tolerance per cell (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _atlas_arguments(p: argparse.ArgumentParser) -> None:
    from attnviz.atlas import ENGINES, PRECISIONS

    model_args(p)
    p.add_argument("--corpus", required=True, type=in_file, help="one source sentence per line (UTF-8)")
    p.add_argument(
        "--targets",
        type=in_file,
        help="one decoder input per line, as --tgt of `attnviz attention` (default: the model's greedy output)",
    )
    p.add_argument("--out", required=True, type=out_dir, help="the folder to write; a run stopped there resumes")
    p.add_argument("--batch", type=int_in(1, 4096), default=32, help="sentences per batch (default: 32)")
    p.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="bf16: products in bfloat16, softmax in float32"
    )
    p.add_argument("--engine", choices=ENGINES, default="local", help="ray: Ray Data batch inference (RAY_ADDRESS)")
    p.add_argument("--limit", type=int_in(1, 10**9), help="read only the first N lines")
    p.add_argument(
        "--allow-unknown",
        action="store_true",
        help="keep lines with characters the model's tokenizer cannot read (each becomes its unknown token); "
        "without it they are skipped and counted as 'unknown'",
    )


def _evaluate_arguments(p: argparse.ArgumentParser) -> None:
    model_args(p)
    p.add_argument("--n", type=int_in(1, 1_000_000), default=1000)
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=1)
    p.add_argument("--show-misses", type=int_in(0, 1_000_000), default=5)


def _train_arguments(p: argparse.ArgumentParser) -> None:
    from attnviz.training.data import TASKS

    p.add_argument("task", choices=TASKS, help="the generated task: " + " or ".join(TASKS))
    p.add_argument("--out", required=True, type=out_dir, help="checkpoint directory to write")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    device_arg(p)
    p.add_argument("--steps", type=int_in(1, 10_000_000), help="override the recipe's number of steps")
    p.add_argument(
        "--batch-size", type=int_in(1, 4096), help="override the recipe's sequences per step (32 to 96, by task)"
    )
    p.add_argument("--lr-scale", type=float_in(1e-6, 1e3), help="multiplies the learning rate of equation 3")
    p.add_argument("--eval-n", type=int_in(1, 1_000_000), default=1000)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the training stopped in OUT from its last saved state (saved at each history record), "
        "keeping its history and recording on at its interval",
    )
    p.add_argument(
        "--history-every",
        type=int_in(0, 10_000_000),
        default=0,
        metavar="N",
        help="record the training's history into OUT/history every N steps and at the last (docs/history.md); "
        "0: none (default; with --resume, the stopped run's interval)",
    )


def _history_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=existing_path, help="the training's --out folder, or its history/ folder")
    p.add_argument(
        "--out",
        required=True,
        type=out_file,
        help="F.npz: step, the losses, each probe's tokens and maps, a manifest; F.csv: the losses and every head's "
        "statistics in long form (step, kind, layer, head, statistic, value)",
    )


# name -> (its help, its arguments, what it runs)
COMMANDS = {
    "translate": ("print the model's output for a sentence", _translate_arguments, _translate),
    "generate": ("print a language model's continuation of a prompt", _generate_arguments, _generate),
    "attention": ("write every attention map for one sentence to an .npz file", _attention_arguments, _attention),
    "attribute": (
        "write a contribution method's maps (beyond the attention weights) to an .npz file",
        _attribute_arguments,
        _attribute,
    ),
    "diff": (
        "compare two attention exports (.npz) or two atlas folders: exit 0 if equal within tolerance, 1 if not",
        _diff_arguments,
        _diff,
    ),
    "atlas": ("every head's statistics over a corpus, written as Parquet files to a folder", _atlas_arguments, _atlas),
    "evaluate": (
        "exact match on freshly generated held-out pairs (a language model: accuracy on the repeated half)",
        _evaluate_arguments,
        _evaluate,
    ),
    "train": ("train a model from scratch on generated data", _train_arguments, _train),
    "history": (
        "write a training's history (attnviz train --history-every) as .npz or .csv",
        _history_arguments,
        _history,
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, that command's arguments alone (every other command is
    named, with its help), so that a command imports only what its own arguments need: ``attnviz diff``,
    ``attnviz --help`` and a mistyped command never import torch (3-4 s on a 2-core AMD EPYC)."""
    parser = Parser(prog="attnviz", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (summary, arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=summary)
        if command is None or command == name:
            arguments(p)
        p.set_defaults(run=run)
    return parser


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    # attnviz's warnings (an output cut at the length limit, a pickle read) as `attnviz: warning:` lines.
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setFormatter(logging.Formatter("attnviz: warning: %(message)s"))
    warnings.setLevel(logging.WARNING)
    logging.getLogger("attnviz").addHandler(warnings)
    try:
        return _run(argv)
    finally:
        logging.getLogger("attnviz").removeHandler(warnings)


def _run(argv: list[str] | None) -> int:
    try:
        words = sys.argv[1:] if argv is None else argv
        # The command's arguments import torch and the API; run as its own process, the command keeps them
        # out of the garbage collector's passes (attnviz.startup), called from Python it leaves the caller's be.
        with imports_kept(own_process=argv is None):
            args = build_parser(words[0] if words else "").parse_args(words)
        status = args.run(args) or 0
    except AttnvizError as e:
        print(f"attnviz: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # a file that could not be read or written
        print(f"attnviz: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("attnviz: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, or memory running out: one line, and the traceback on request
        if os.environ.get("ATTNVIZ_DEBUG"):
            raise
        detail = _one_line(str(e))[:500]  # a message quoting something huge stays one readable line
        print(
            f"attnviz: error: unexpected {type(e).__name__}: {detail} (exit status {EXIT_UNFORESEEN}: not an "
            "answer but an error attnviz did not foresee; ATTNVIZ_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_UNFORESEEN
    return status


if __name__ == "__main__":
    sys.exit(main())
