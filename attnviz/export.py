"""What one sentence's forward pass gives back as plain numpy data, and the .npz export of its maps.

The export holds only numbers, unicode strings and a JSON manifest, so ``numpy.load(path,
allow_pickle=False)`` reads it and nothing in it is ever unpickled. numpy's unicode arrays drop a
string's trailing NUL characters, so when a token ends in NUL the file also holds each token's
length (``src_token_lengths``, ``tgt_token_lengths``), from which the reader restores them; a
file without them reads as before.

Maps from another library (`attnviz.notebook.data.plain_export`) have tokens but no ids, and their
files hold no ``src_ids`` or ``tgt_ids``: the tokens are what labels a map's rows and columns.

The manifest's ``format_version`` says which layout a file has (`FORMAT_VERSIONS`). A file
without one is version 1. [`load_export`][attnviz.export.load_export] reads every version attnviz has
written and refuses a newer one, so an old attnviz never misreads a file it does not know.
"""

from __future__ import annotations

import io
import json
import math
import os
import secrets
import stat
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import BinaryIO

import numpy as np

from attnviz.errors import AttnvizError, ExportError, InputError, describe
from attnviz.kinds import KINDS, axis_names, check_kind, held_axes, writing_labels

STANDARD_ARRAYS = (
    "encoder",
    "decoder",
    "cross",
    "src_ids",
    "tgt_ids",
    "src_tokens",
    "tgt_tokens",
    "src_token_lengths",  # only when a source token ends in NUL: each token's length in characters
    "tgt_token_lengths",
    "manifest",
)
# Every layout of the .npz file attnviz has written; load_export reads them all.
FORMAT_VERSIONS = {
    1: "the arrays and a JSON manifest; the manifest has no format_version",
    2: "version 1, with manifest['format_version'] and manifest['run']: where and how the maps were computed",
    3: "version 2, where a language model's file holds decoder, tgt_ids, tgt_tokens and the manifest, and no "
    "encoder, cross or src_*; the manifest names the family and the architecture",
}
FORMAT_VERSION = max(FORMAT_VERSIONS)  # what AttentionExport.save writes
# What each axis of each kind of exported map holds; a manifest names those of the kinds its file holds (held_axes).
AXES = held_axes(KINDS)
# A file's arrays are checked against these before any is decompressed: golden files arrive in pull
# requests, and a 1 MB .npz can declare a GiB of zeros. ATTNVIZ_MAX_EXPORT_MB raises the bound.
MAX_EXPORT_MB = 512
# How far two exports' maps may differ and still be equal (attnviz diff, the snapshot plugin): across
# CPUs (AVX2 against AVX-512), thread counts and attnviz's kernel choices the maps of one model agree
# to about 1e-6 (docs/tolerances.md, with the measurements).
DEFAULT_ATOL = 1e-5
MAX_MANIFEST_CHARS = 1_000_000
MAX_JSON_DEPTH = 16  # a real manifest nests 3 deep (config, axes, run, ablation)
KIND_WORDS = {"f": "real floating-point numbers", "iu": "integers", "U": "text"}  # ARRAY_KINDS, in words
ARRAY_KINDS = {  # what each standard array's dtype must be: numpy's kind letters
    "encoder": "f",  # real floats: a complex map would compare as equal to its real part
    "decoder": "f",
    "cross": "f",
    "src_ids": "iu",
    "tgt_ids": "iu",
    "src_tokens": "U",
    "tgt_tokens": "U",
    "src_token_lengths": "iu",
    "tgt_token_lengths": "iu",
    "manifest": "U",
}
# The arrays that hold one value per token: a 0-d string would be read as a token per character, a 2-D one as
# tokens that are lists, and ids of another shape would never equal the same text's.
LISTS = ("src_ids", "tgt_ids", "src_tokens", "tgt_tokens")


def path_argument(name: str, value: object, takes: str) -> Path:
    """``value``, the argument ``name``, as a Path; an InputError naming it and what it ``takes`` ("the atlas's
    folder") when it is not text or a path: None or a number had failed deep inside, in ``Path()``, with a bare
    TypeError, and ``str()`` of one names a file that is not the caller's ("None")."""
    if isinstance(value, str) or (isinstance(value, os.PathLike) and isinstance(os.fspath(value), str)):
        return Path(value)
    got = "None" if value is None else type(value).__name__
    raise InputError(f"{name} must be {takes}, as text or a Path; got {got}")


def positive_setting(
    name: str, default: float, unit: str, error: type[AttnvizError] = ExportError, public: str | None = None
) -> float:
    """``default``, or the environment's ``name``; one that is not a finite positive number is ``error``
    (with ``public`` for a visitor), as the checkpoints' ``ATTNVIZ_MAX_*`` limits: read as the default, as
    no room or as no bound, it would allow or refuse what its operator did not mean."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise error(f"{name}={text!r} is not a positive number of {unit}", public)
    return value


def max_export_bytes() -> int:
    """The most bytes a file's arrays may hold once decompressed: ``ATTNVIZ_MAX_EXPORT_MB``, else 512 MB
    (`positive_setting`)."""
    return int(positive_setting("ATTNVIZ_MAX_EXPORT_MB", MAX_EXPORT_MB, "MB") * 2**20)


def size_text(n_bytes: float) -> str:
    """'1,024 MB', '2.5 MB', '3,888 bytes': a size for a message, never rounded to "0 MB" (a small
    ATTNVIZ_MAX_EXPORT_MB had made "about 0 MB, over the 0 MB an export may hold")."""
    mb = n_bytes / 2**20
    return f"{mb:,.0f} MB" if mb >= 10 else f"{mb:.2g} MB" if mb >= 1 else f"{n_bytes:,.0f} bytes"


def maps_bytes(cfg, src_len: int, tgt_len: int | None = None) -> int:
    """About how many bytes every attention map of one text takes in float32, before any is made.

    ``src_len`` tokens are read (a language model's prompt and what it generates); ``tgt_len`` is
    the decoder input's length, None for a model writing its own output, taken to write as many
    tokens as it reads, plus its start token. ``cfg`` is the model's TransformerConfig.
    """
    S = src_len
    if cfg.decoder_only:
        cells = cfg.n_dec_layers * S * S
    elif cfg.encoder_only:
        cells = cfg.n_enc_layers * S * S
    else:
        T = S + 1 if tgt_len is None else tgt_len
        cells = cfg.n_enc_layers * S * S + cfg.n_dec_layers * (T * T + T * S)
    return 4 * cfg.n_heads * cells


def check_regular_file(path: Path, what: str = "export") -> None:
    """Nothing, or an ExportError when ``path`` is not a regular file (a FIFO would hang its reader)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ExportError(f"{path} does not exist") from None
    except OSError as e:
        raise ExportError(f"{path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise ExportError(f"{path} is {kind}, not an {what} file")


def write_atomically(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in its folder and a rename, so that a killed
    run never leaves a truncated file, and an earlier good file stays until the new one is whole."""
    path = path_argument("path", path, "the file to write")
    if path.is_symlink() and not path.exists():
        raise ExportError(
            f"{path} is a dangling symbolic link (to {os.readlink(path)}, which does not exist): remove the link or "
            "name another file"
        )
    if path.exists():
        check_regular_file(path, "output")  # never write into a FIFO, a device or a folder
    # A short name of its own ("x": never someone else's file): ".NAME.tmp" passes the 255-byte limit on a file
    # name when NAME comes near it. open(), not mkstemp: the file keeps the permissions the umask gives.
    tmp = path.with_name(f".attnviz-{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        f = open(tmp, "xb")
    except OSError as e:  # not the temporary file's name: the caller never named it
        raise ExportError(f"{path} cannot be written: its folder takes no new file ({e.strerror or e})") from None
    try:
        with f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _json_depth(value, depth: int = 0) -> int:
    if depth > MAX_JSON_DEPTH:
        return depth
    if isinstance(value, dict):
        return max((_json_depth(v, depth + 1) for v in value.values()), default=depth + 1)
    if isinstance(value, list):
        return max((_json_depth(v, depth + 1) for v in value), default=depth + 1)
    return depth


def array_members(archive: zipfile.ZipFile, error: Callable[[str, str], AttnvizError]) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by array name, each a ``<name>.npy``, once, unencrypted; otherwise
    ``error(problem, member)`` is raised, ``problem`` being "not an array", "twice" or "encrypted", so that each
    reader words it as its own messages.

    np.load reads a member by either name (a bare ``encoder`` before ``encoder.npy``, the last of two
    ``encoder.npy``), so a second one would be read unchecked; zipfile raises a RuntimeError for an encrypted one;
    and a member of another name is raw bytes to numpy, not an array.
    """
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name in members:
            raise error("twice", info.filename)
        if name == info.filename:
            raise error("not an array", info.filename)
        if info.flag_bits & 0x1:
            raise error("encrypted", info.filename)
        members[name] = info
    return members


def _member_error(path: Path) -> Callable[[str, str], ExportError]:
    def error(problem: str, member: str) -> ExportError:
        shown = describe(member)
        return ExportError(
            f"{path} is not a readable attnviz export: "
            + {
                "not an array": f"it holds the member {shown}, which is not an array member (name.npy)",
                "twice": f"it holds the array {describe(member.removesuffix('.npy'))} twice",
                "encrypted": f"its member {shown} is encrypted, which an attnviz export never is",
            }[problem]
        )

    return error


def _check_members(path: Path, archive: zipfile.ZipFile) -> None:
    """Each array's declared dtype and shape, read from its header alone, against the limits."""
    total, limit = 0, max_export_bytes()
    for name, info in array_members(archive, _member_error(path)).items():
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(member)
        if dtype.hasobject:
            raise ExportError(
                f"{path} is not a readable attnviz export: the array {name!r} holds Python objects (pickled "
                "data), which an attnviz export never does"
            )
        kinds = ARRAY_KINDS.get(name)
        if kinds is not None and dtype.kind not in kinds:
            want = KIND_WORDS[kinds]
            raise ExportError(f"{path}: the array {name!r} holds {dtype} values, not {want}")
        if name in LISTS and len(shape) != 1:
            raise ExportError(
                f"{path}: the array {name!r} is shaped {tuple(shape)}, not a list (1-D) with one entry per token"
            )
        if name == "manifest" and dtype.itemsize // 4 > MAX_MANIFEST_CHARS:
            raise ExportError(
                f"{path}: its manifest is {dtype.itemsize // 4:,} characters long, over {MAX_MANIFEST_CHARS:,}"
            )
        total += math.prod(shape) * dtype.itemsize
        if total > limit:
            raise ExportError(
                f"{path} declares {size_text(total)} of arrays or more once decompressed, over the limit of "
                f"{size_text(limit)} (ATTNVIZ_MAX_EXPORT_MB raises it)"
            )


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def kind_tokens(
    kind: str, src_tokens: tuple[str, ...] | None, tgt_tokens: tuple[str, ...] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(query tokens, key tokens) of ``kind``'s maps: the source for the encoder, the decoder input
    otherwise; cross-attention has decoder-input rows and source columns."""
    queries = src_tokens if check_kind(kind) == "encoder" else tgt_tokens
    return tuple(queries), tuple(tgt_tokens if kind == "decoder" else src_tokens)


def written(
    tgt_tokens: tuple[str, ...] | None, truncated: bool, language_model: bool, end_token: str = "</s>"
) -> tuple[str, ...] | None:
    """Per decoder position, the token it writes; None for an encoder-only model (no ``tgt_tokens``).

    The decoder input is the start token and then the output, so position t writes the input's
    token t + 1, and the last position writes ``end_token``. A language model's last position
    writes the token after its input, which the input does not hold: "…". When the output was cut at the
    length limit (``truncated``) the last position's token is unknown: "…". With a given target
    (teacher forcing) a position writes the target's next token: what it is trained to predict,
    which its own prediction may miss.
    """
    if tgt_tokens is None:
        return None
    return (*tgt_tokens[1:], "…" if truncated or language_model else end_token)


def row_labels(maps, kind: str) -> list[str]:
    """The query labels of ``kind``'s maps: source tokens, or decoder positions as "input → the token it writes".

    ``maps`` is anything that names its rows and columns as an export does (``tokens(kind)`` and
    ``writes()``): an [`AttentionExport`][attnviz.export.AttentionExport] or a
    [`TiledAttention`][attnviz.tiles.TiledAttention]. The app's pages and the notebook views label rows with it.
    """
    queries, _ = maps.tokens(kind)
    return list(queries) if kind == "encoder" else writing_labels(queries, maps.writes())


@dataclass(frozen=True)
class AttentionExport:
    """Every attention map for one sentence pair, as numpy arrays, with token labels.

    ``encoder`` (L, H, S, S), ``decoder`` (L, H, T, T), ``cross`` (L, H, T, S), float32: rows are
    queries, columns are keys. ``tgt_ids`` is exactly the decoder input, starting with the start token.
    Maps from another library (`attnviz.notebook.data.plain_export`) have no ids: their tokens label them.
    """

    encoder: np.ndarray | None  # None for a language model (decoder-only), like cross, src_ids, src_tokens
    decoder: np.ndarray | None  # None for an encoder-only model, like cross, tgt_ids, tgt_tokens
    cross: np.ndarray | None
    src_ids: np.ndarray | None  # None, like tgt_ids, for maps from another library: they come with tokens alone
    tgt_ids: np.ndarray | None
    src_tokens: tuple[str, ...] | None
    tgt_tokens: tuple[str, ...] | None
    manifest: dict
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # further named arrays, e.g. a method's relevance

    @property
    def format_version(self) -> int:
        """The layout this export was read in (1 when its manifest names none); files are written in the newest."""
        return self.manifest.get("format_version", 1)

    def tokens(self, kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query tokens, key tokens) of ``kind``'s maps: the source for the encoder, the decoder input
        otherwise; cross-attention has decoder-input rows and source columns."""
        if getattr(self, check_kind(kind)) is None:
            raise ValueError(f"this export has no {kind} maps (an encoder-only model has only the encoder's)")
        return kind_tokens(kind, self.src_tokens, self.tgt_tokens)

    def writes(self, end_token: str = "</s>") -> tuple[str, ...] | None:
        """Per decoder position, the token it writes; None for an encoder-only model (`written`). Maps from another
        library (no ids) say nothing of what their last position writes: "…", with or without an encoder's maps."""
        unknown_end = self.encoder is None or (self.tgt_ids is None and self.tgt_tokens is not None)
        return written(self.tgt_tokens, bool(self.manifest.get("tgt_truncated")), unknown_end, end_token)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the .npz file: numbers, unicode strings and a JSON manifest; no objects.

        An encoder-only model's file holds ``encoder``, ``src_ids``, ``src_tokens`` and ``manifest``,
        and every file also holds ``extras`` under their own names. The manifest is written with the
        current ``format_version``, whatever the export was read from.
        """
        manifest = {**self.manifest, "format_version": FORMAT_VERSION}
        arrays = {
            "encoder": self.encoder,
            "decoder": self.decoder,
            "cross": self.cross,
            "src_ids": self.src_ids,
            "tgt_ids": self.tgt_ids,
            **_token_arrays("src", self.src_tokens),
            **_token_arrays("tgt", self.tgt_tokens),
            "manifest": np.array(json.dumps(manifest, ensure_ascii=False)),
        }
        clash = sorted(set(STANDARD_ARRAYS) & set(self.extras))
        if clash:
            raise ValueError(f"extra arrays may not reuse the export's own names {clash}")
        return {name: a for name, a in {**arrays, **self.extras}.items() if a is not None}

    def save(self, path: str | Path) -> Path:
        """Write the .npz file to ``path`` (through a temporary file and a rename: never half a file)."""
        path = path_argument("path", path, "the file to write")  # before the file's content is made
        return write_atomically(path, self.to_bytes())  # bytes, so numpy does not append ".npz"

    def to_bytes(self) -> bytes:
        """The .npz file's content (what `attnviz attention --out` writes)."""
        buf = io.BytesIO()
        self.write(buf)
        return buf.getvalue()

    def write(self, out: BinaryIO) -> None:
        """Write the .npz file's content to the binary file ``out``, an array at a time (an open file on
        disk holds none of it in memory)."""
        np.savez_compressed(out, **self.arrays())


def _token_arrays(side: str, tokens: tuple[str, ...] | None) -> dict[str, np.ndarray]:
    """``{side}_tokens`` as a unicode array and, when a token ends in NUL (which numpy's unicode arrays drop),
    ``{side}_token_lengths``: each token's length in characters. The array is as wide as the longest token, NULs
    included, so that a reader can bound the lengths by its width."""
    if tokens is None:
        return {}
    width = max((len(t) for t in tokens), default=1) or 1
    arrays = {f"{side}_tokens": np.array(tokens, dtype=f"<U{width}")}
    if any(t.endswith("\x00") for t in tokens):
        arrays[f"{side}_token_lengths"] = np.array([len(t) for t in tokens], dtype=np.int64)
    return arrays


def _read_tokens(z, side: str, path: Path) -> tuple[str, ...] | None:
    """The tokens of ``side`` ("src" or "tgt") in the open file ``z``, their trailing NULs restored; None if none."""
    name, lengths_name = f"{side}_tokens", f"{side}_token_lengths"
    if name not in z.files:
        return None
    array = z[name]
    tokens = tuple(array.tolist())
    if lengths_name not in z.files:
        return tokens
    lengths = z[lengths_name]
    width = array.dtype.itemsize // 4
    if lengths.shape != (len(tokens),) or any(
        not len(t) <= n <= width for t, n in zip(tokens, lengths.tolist(), strict=True)
    ):
        raise ExportError(
            f"{path} is not a readable attnviz export: {lengths_name} does not give a length for each of its "
            f"{len(tokens)} {name} within the array's {width} characters"
        )
    return tuple(t + "\x00" * (n - len(t)) for t, n in zip(tokens, lengths.tolist(), strict=True))


def load_export(path: str | Path) -> AttentionExport:
    """Read a file written by [`AttentionExport.save`][attnviz.export.AttentionExport.save], in any format
    version (never unpickles).

    The ids are optional (maps from another library have none); a file needs its maps, the tokens of their
    axes and a manifest.

    Raises [`ExportError`][attnviz.errors.ExportError] for a file that is not an attnviz export (corrupt,
    truncated, another program's .npz, pickled data, a member twice or encrypted, maps or manifest fields that are
    not what attnviz writes: `check_contents`) or that a newer attnviz wrote.
    """
    path = path_argument("path", path, "the export file to read (.npz)")
    check_regular_file(path)
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":  # one bare array, whose header may declare any size: refused before np.load reads it
        raise ExportError(f"{path} holds one array (.npy), not an attnviz export (an .npz of several arrays)")
    if not magic.startswith(b"PK"):  # np.load would try it as a pickle
        raise ExportError(f"{path} is not an .npz file: an attnviz export is a zip archive of arrays")
    try:
        with zipfile.ZipFile(path) as archive:
            _check_members(path, archive)
        z = np.load(path, allow_pickle=False)
        with z:
            found = ", ".join(z.files[:8]) or "none"
            kinds = [kind for kind in KINDS if kind in z.files]
            if not kinds:
                raise ExportError(
                    f"{path} is not an attnviz export: no encoder, decoder or cross maps in it (it has: {found})"
                )
            sides = {"src": {"encoder", "cross"}, "tgt": {"decoder", "cross"}}  # whose tokens label each kind's axes
            required = [f"{side}_tokens" for side, users in sides.items() if users & set(kinds)]
            missing = [name for name in (*required, "manifest") if name not in z.files]
            if missing:
                raise ExportError(f"{path} is not an attnviz export: no {', '.join(missing)} in it (it has: {found})")
            # Ids stand for tokens, which attnviz always writes with them: ids alone were compared with nothing
            # (diff called such a file equal to one without them) or with the other file's tokens.
            for side in sides:
                if f"{side}_ids" in z.files and f"{side}_tokens" not in z.files:
                    raise ExportError(
                        f"{path} is inconsistent: it has {side}_ids but no {side}_tokens, which attnviz writes with "
                        "them; write the file again, or remove its ids"
                    )
            try:
                manifest = json.loads(str(z["manifest"]))
            except RecursionError:
                raise ExportError(f"{path}: its manifest nests too deep to be an attnviz manifest") from None
            if not isinstance(manifest, dict):
                raise ExportError(f"{path} is not an attnviz export: its manifest is not a JSON object")
            if _json_depth(manifest) > MAX_JSON_DEPTH:
                raise ExportError(f"{path}: its manifest nests deeper than {MAX_JSON_DEPTH} levels")
            _check_format_version(path, manifest)
            get = lambda name: z[name] if name in z.files else None  # noqa: E731
            export = AttentionExport(
                encoder=get("encoder"),
                decoder=get("decoder"),
                cross=get("cross"),
                src_ids=get("src_ids"),
                tgt_ids=get("tgt_ids"),
                src_tokens=_read_tokens(z, "src", path),
                tgt_tokens=_read_tokens(z, "tgt", path),
                manifest=manifest,
                extras={name: z[name] for name in z.files if name not in STANDARD_ARRAYS},
            )
            check_contents(export, str(path))
            return export
    except (ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError) as e:
        # numpy's own messages for these speak of pickles and zip members; say what the user has.
        raise ExportError(f"{path} is not a readable attnviz export (.npz): {type(e).__name__}: {e}") from None


def holds_weights(manifest: dict) -> bool:
    """Whether an export with this manifest holds post-softmax weights, not a method's numbers (``method``)."""
    return manifest.get("method") in (None, "attention")


def _non_finite(value, where: str = "") -> str | None:
    """Where in a parsed JSON value the first number that is not finite is ("run.threads"), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        inner = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        if (found := _non_finite(item, inner)) is not None:
            return found
    return None


def check_manifest(manifest: dict, what: str) -> None:
    """An ExportError where a manifest field that attnviz reads back is not of the type it writes: a number for
    ``src`` had crashed diff, and ``"tgt_truncated": "false"``, true for Python, labelled every row '→ …'."""
    if (where := _non_finite(manifest)) is not None:  # json reads NaN and Infinity, which JSON itself has not
        raise ExportError(f"{what}: its manifest holds a number that is not finite ({where})")
    fields = {  # field: (what a value must be, whether one is); an absent field is always allowed
        "src": ("a text or null", lambda v: v is None or isinstance(v, str)),
        "tgt": ("a text or null", lambda v: v is None or isinstance(v, str)),
        "method": ("the name of a method (a text) or null", lambda v: v is None or isinstance(v, str)),
        "note": ("a text", lambda v: isinstance(v, str)),
        "tgt_truncated": ("true, false or a whole number", lambda v: isinstance(v, int)),
        "generated": ("true, false or a whole number of 0 or more", lambda v: isinstance(v, int) and v >= 0),
    }
    for name, (want, good) in fields.items():
        if name in manifest and not good(manifest[name]):
            raise ExportError(f"{what}: its manifest's {name} is {describe(manifest[name])}, not {want}")
    axes = manifest.get("axes", {})
    if not isinstance(axes, dict):
        raise ExportError(f"{what}: its manifest's axes are {describe(axes)}, not an object of each kind's axes")
    for kind, names in axes.items():
        if kind not in KINDS:
            raise ExportError(f"{what}: its manifest names the axes of {describe(kind)}, which is not a kind of map")
        # The axes follow from the kind, and diff labels cells by them: axes that contradict the kind (encoder axes
        # naming decoder positions) say the file is not what it claims, and which of the two is right is unknown.
        legal = [
            [*lead, *axis_names(kind, unit)] for lead in (["layer", "head"], ["layer"]) for unit in ("position", "word")
        ]
        if names not in legal:
            raise ExportError(
                f"{what}: its manifest's axes of {kind} are {describe(names)}, not ({', '.join(legal[0])}) as "
                "attnviz writes them"
            )


def _check_maps(export: AttentionExport, what: str, finite: bool = True) -> None:
    """An ExportError where a kind's maps are not of a rank attnviz writes (weights (layer, head, query, key), a
    method's per head or per layer (layer, query, key)), have no layer or head, or hold a number that is not
    finite (``finite``: the snapshot plugin leaves those to its invariants, which say in which heads): diff had
    compared such maps by value alone, and NaN equals NaN there."""
    weights = holds_weights(export.manifest)
    axes = export.manifest.get("axes", {})
    for kind in KINDS:
        maps = getattr(export, kind)
        if maps is None:
            continue
        shape = tuple(np.shape(maps))
        if len(shape) != 4 and (weights or len(shape) != 3):
            also = "" if weights else " or, for a method's maps, (layer, query, key)"
            raise ExportError(f"{what}: its {kind} maps are shaped {shape}, not (layer, head, query, key){also}")
        if kind in axes and len(axes[kind]) != len(shape):
            raise ExportError(
                f"{what}: its {kind} maps are shaped {shape}, but its manifest names {len(axes[kind])} axes for them"
            )
        if 0 in shape[:-2]:
            raise ExportError(f"{what}: its {kind} maps have no layer or no head (shaped {shape})")
        if not finite:
            continue
        good = np.isfinite(maps)
        if not good.all():
            n = int(good.size - np.count_nonzero(good))
            first = tuple(int(i) for i in np.argwhere(~good)[0])
            raise ExportError(
                f"{what}: its {kind} maps hold {n:,} value{'s' * (n != 1)} that {'is' if n == 1 else 'are'} not "
                f"finite (NaN or infinite), the first at index {first}"
            )


def check_contents(export: AttentionExport, what: str, finite: bool = True) -> None:
    """An ExportError, naming ``what``, where an export is not what attnviz writes: a manifest field of another type
    (`check_manifest`), maps of another rank, without layers or heads or not finite (`_check_maps`), or maps whose
    sizes disagree with their tokens (`check_sizes`). load_export checks every file with it."""
    check_manifest(export.manifest, what)
    _check_maps(export, what, finite)
    check_sizes(export, what)


def check_sizes(export: AttentionExport, what: str) -> None:
    """An ExportError where a map's last two axes disagree with the tokens of its queries and keys (a diff
    would call such a file another text, a view would label it wrongly); ``what`` names the export. The ids
    may outnumber the tokens: a file of word maps (--words) keeps the pieces' ids."""
    for kind in KINDS:
        maps = getattr(export, kind)
        if maps is None:
            continue
        queries = export.src_tokens if kind == "encoder" else export.tgt_tokens
        keys = export.tgt_tokens if kind == "decoder" else export.src_tokens
        if queries is None or keys is None:
            raise ExportError(f"{what} is inconsistent: it has {kind} maps but not the tokens of their axes")
        if np.ndim(maps) < 2 or tuple(np.shape(maps)[-2:]) != (len(queries), len(keys)):
            raise ExportError(
                f"{what} is inconsistent: its {kind} maps are shaped {np.shape(maps)} for {len(queries)} query "
                f"and {len(keys)} key tokens"
            )


def _check_format_version(path: Path, manifest: dict) -> None:
    version = manifest.get("format_version", 1)
    if type(version) is not int or version < 1:
        raise ExportError(f"{path} has an unreadable format_version {version!r} in its manifest")
    if version > FORMAT_VERSION:
        raise ExportError(
            f"{path} was written by a newer attnviz (export format {version}; this attnviz "
            f"{package_version('attnviz')} reads formats 1 to {FORMAT_VERSION}): upgrade attnviz to read it"
        )


@dataclass(frozen=True)
class ForwardPass:
    """Every intermediate tensor of one teacher-forced forward pass, as recorded by the model.

    ``tensors`` maps point names (`attnviz.hooks`), such as ``encoder.0.attn.weights``, to
    float32 arrays without the batch axis; ``tgt_ids`` and ``tgt_tokens`` are None for an
    encoder-only model. The forward-pass walkthrough shows it stage by stage. ``tgt_truncated``: the
    decoder input is the model's greedy output, cut at the length limit before its end token (as an
    export's manifest says it).
    """

    tensors: dict[str, np.ndarray]
    src_ids: tuple[int, ...]
    src_tokens: tuple[str, ...]
    tgt_ids: tuple[int, ...] | None
    tgt_tokens: tuple[str, ...] | None
    tgt_truncated: bool = False
