"""The one training loop of attnviz's own models, with the paper's recipe (section 5), for both kinds of model.

Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9; the learning rate of equation 3,
lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); label smoothing 0.1; dropout on
sub-layer outputs and embedding sums. Data is generated at train time (`attnviz.training.data`),
seeds are fixed, and the tokenizer is trained on generated text first, so one command reproduces a
model. What differs between an encoder-decoder model and a language model (the batches, the
evaluation, the card) lives in `attnviz.training.seq2seq` and `attnviz.training.lm`.

With ``history_every`` the loop records the training's history (`attnviz.training.recording`)
and saves its state (`STATE_FILE`) at each record; ``resume`` continues from that state, with the
same weights, optimiser, learning rate, random generator and data position, and keeps the records.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnviz.checkpoints.files import CONFIG_FILE
from attnviz.checkpoints.native import CARD_FILE, SPM_FILE, WEIGHTS_FILE, save_checkpoint
from attnviz.devices import resolve_device
from attnviz.errors import InputError
from attnviz.model import Transformer
from attnviz.training import lm, seq2seq
from attnviz.training.data import Task, get_task
from attnviz.training.formation import lm_section, seq2seq_section
from attnviz.training.history import HISTORY, MANIFEST, RECORDS, TEMP_PREFIX, load_history, recorded_every
from attnviz.training.optim import paper_optimizer
from attnviz.training.recipes import RECIPES, Recipe
from attnviz.training.recording import TrainingRecorder

STATE_FILE = "train_state.pt"  # the state a resumed training continues from; not part of the checkpoint
STATE_EVERY = 500  # steps between saved states when no history is recorded
# What a saved state holds, and of which type: anything else is a damaged file, refused before it is used.
STATE_TYPES = {
    "step": int,
    "model": dict,
    "optimizer": dict,
    "schedule": dict,
    "rng": torch.Tensor,
    "loss_avg": float,  # every state follows a step, which gave the running mean a value
    "curve": list,
    "seconds": (int, float),
    "recipe": dict,
    "seed": int,
    "history_every": (int, type(None)),  # None: a state saved before it was kept
}
# What a training writes into its --out: a new training there, not resumed, would mix its files with these.
TRAINING_FILES = (HISTORY, STATE_FILE, WEIGHTS_FILE)
# What else it writes there, the rest of its checkpoint: a file of these names (a user's README.md) would be lost.
CHECKPOINT_FILES = (CONFIG_FILE, SPM_FILE, CARD_FILE, lm.PROBE_FILE)
CURVE_EVERY = lm.CURVE_EVERY


@dataclass
class Kind:
    """What one kind of model brings to the loop: its data per step, its batches and its forward pass."""

    texts: Iterator[list]  # one step's training data per item
    batch: Callable[[list], tuple]  # a step's data -> tensors
    heldout: Callable[[list[tuple[str, str]]], tuple]  # held-out pairs -> the same tensors
    forward: Callable[[Transformer, tuple], tuple[torch.Tensor, torch.Tensor]]  # -> (logits, labels)
    keep: float  # the running mean of the loss keeps this much of the old value per step


def loss_of(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Cross-entropy of (B, T, V) logits against (B, T) labels, padding (-100) ignored."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=label_smoothing)


def optimise(optimizer, schedule, logits, labels, label_smoothing: float) -> float:
    """One step of the paper's training: cross-entropy (padding labels -100 ignored), backward, Adam
    step, the learning-rate schedule; the loss, as a float."""
    loss = loss_of(logits, labels, label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return float(loss.detach())


def running_mean(mean: float | None, value: float, step: int, keep: float) -> float:
    """The loss's exponential running mean (``keep`` of the old per step), refusing a diverged run."""
    mean = value if mean is None else keep * mean + (1 - keep) * value
    if not math.isfinite(mean):  # the settings the user chose (a learning rate too high): bad input, exit 2
        raise InputError(f"training diverged at step {step} (loss {mean}); lower --lr-scale")
    return mean


def _progress(step: int, total: int, loss: float, lr: float, start: float, extra: str = "") -> None:
    done = step / total
    elapsed = time.time() - start
    eta = elapsed / done - elapsed if done else 0.0
    bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
    print(
        f"\r[{bar}] {step}/{total} loss {loss:.3f} lr {lr:.2e} {elapsed / 60:.1f} min, eta {eta / 60:.1f} min{extra}",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _kind(task: Task, recipe: Recipe, tok, seed: int, dev) -> Kind:
    if task.decoder_only:
        return Kind(
            texts=lm.step_texts(task, recipe, seed),
            batch=lambda texts: lm.lm_batch(texts, tok, dev),
            heldout=lambda pairs: lm.lm_batch([text for text, _ in pairs], tok, dev),
            forward=lm.forward,
            keep=0.95,
        )
    return Kind(
        texts=seq2seq.step_texts(task, recipe, seed),
        batch=lambda pairs: seq2seq.make_batch(pairs, tok, dev),
        heldout=lambda pairs: seq2seq.make_batch(pairs, tok, dev),
        forward=seq2seq.forward,
        keep=0.98,
    )


def save_state(path: Path, state: dict) -> None:
    """``state`` (tensors, numbers, strings, lists and dicts only) to ``path``, through a temporary file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: Path, recipe: Recipe, seed: int) -> dict:
    """A saved state (read with ``weights_only``: nothing in it is unpickled as code), checked to be this
    training's: the same recipe but for its number of steps, and the same seed."""
    if not path.is_file():
        raise InputError(f"nothing to resume in {path.parent}: no {STATE_FILE} (a training saves it as it records)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
        raise InputError(f"{STATE_FILE} cannot be read ({type(e).__name__}): it is corrupt; train again") from None
    if not isinstance(state, dict):
        wrong = ["it is not a dictionary"]
    else:
        wrong = [key for key, kind in STATE_TYPES.items() if not _of_type(state.get(key), kind)]
    if wrong:
        raise InputError(
            f"{STATE_FILE} is not a training's saved state (missing or of the wrong type: {', '.join(wrong)}): it is "
            "damaged; train again"
        )
    damage = _damage(state)
    if damage:
        raise InputError(f"{STATE_FILE} is damaged: {'; '.join(damage)}; train again")
    saved = dict(state["recipe"])
    wanted = dataclasses.asdict(recipe)
    saved.pop("steps", None), wanted.pop("steps")
    if saved != wanted or state.get("seed") != seed:
        raise InputError(f"{STATE_FILE} is the state of another recipe or seed: resume with the same flags")
    return state


def _of_type(value, kind) -> bool:
    """Whether ``value`` is of ``kind`` (a type or a tuple of types), a bool counting as no number: ``True`` is
    no step."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _damage(state: dict) -> list[str]:
    """What is wrong with the values of a state whose types are right: each a phrase, none for a sound state."""
    step, every, seconds, loss = state["step"], state.get("history_every"), state["seconds"], state["loss_avg"]
    damage = []
    if step < 1:  # a state is saved after a step
        damage.append(f"its step is {step}, not 1 or more")
    if every is not None and every < 0:
        damage.append(f"its history_every is {every}, not 0 (none) or more")
    if not math.isfinite(loss):
        damage.append(f"its loss_avg is {loss}")
    if not (math.isfinite(seconds) and seconds >= 0):
        damage.append(f"its seconds are {seconds}, not a time")
    points = state["curve"]
    if not all(
        isinstance(p, (list, tuple))
        and len(p) == 2
        and _of_type(p[0], int)
        and 1 <= p[0] <= step
        and _of_type(p[1], (int, float))
        and math.isfinite(p[1])
        for p in points
    ):
        damage.append("its curve is not a list of [step, loss] points up to its step")
    return damage


def _check_fresh(out: Path) -> None:
    """Refuse an --out that holds a training already (its history, its saved state or its checkpoint): a new
    training there would keep the first one's history records under its own manifest; and one that holds a file
    the training would write (a user's README.md), which would be lost.

    Other files are left be: a training writes only the files named here, so a folder that holds the user's
    notes or data loses nothing, and the checkpoint reads only its own files."""

    held = [name for name in (*TRAINING_FILES, *CHECKPOINT_FILES) if (out / name).exists() or (out / name).is_symlink()]
    if HISTORY in held and _history_unstarted(out / HISTORY):
        held.remove(HISTORY)  # a training killed before its first record: nothing to resume, nothing to keep
    training = [name for name in held if name in TRAINING_FILES]
    if training:
        raise InputError(
            f"{out} holds a training ({', '.join(training)}): add --resume to continue it, or choose another --out for "
            "a new one"
        )
    if held:
        raise InputError(
            f"{out} holds {', '.join(held)}, which the training would write over: choose another --out, or move them"
        )


def _history_unstarted(folder: Path) -> bool:
    """Whether ``folder`` (a training's history/) holds nothing but the empty records/ folder a training makes as it
    starts, and what a killed write left half-done (no manifest: the first record writes it): it had been taken for
    a training that --resume then refused, having no saved state, and only deleting the folder by hand went on."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    records = folder / RECORDS
    if any(p != records for p in folder.iterdir() if not p.name.startswith(TEMP_PREFIX)):
        return False  # its manifest, or anything else
    if not records.exists():
        return True
    return (
        not records.is_symlink() and records.is_dir() and all(p.name.startswith(TEMP_PREFIX) for p in records.iterdir())
    )


def _make_out(out: Path) -> None:
    """Create ``out`` (and the folders above it), refusing one that cannot be written: before the training, which
    would otherwise run to its end to fail on writing its checkpoint."""
    if out.is_symlink() and not out.exists():
        raise InputError(f"{out} is a link to {os.readlink(out)}, which does not exist: name a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{out} is a file: name a folder") from None
    except NotADirectoryError:
        raise InputError(f"{out} is under a file, not a folder: name a folder") from None
    except OSError as e:
        raise InputError(f"the folder {out} cannot be created ({e.strerror or type(e).__name__})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise InputError(f"the folder {out} is not writable")


def _finished(out: Path) -> bool:
    """Whether the training in ``out`` wrote its checkpoint to the end: its weights, and its card, written last."""
    card = out / CARD_FILE
    return (out / WEIGHTS_FILE).is_file() and card.is_file() and card.stat().st_size > 0


def _resumed_every(out: Path, state: dict, asked: int) -> int:
    """The history interval a resumed training records at: the stopped run's, which ``asked`` (the flag) may
    leave out (0) but not change; a run that recorded none may begin with ``asked``. The stopped run's history is
    checked to be there and readable (its manifest), when the state says it had records."""
    saved = state.get("history_every")  # states written before it was kept: the history's own manifest
    saved = recorded_every(out) if saved is None else saved
    if saved and asked and asked != saved:
        raise InputError(
            f"the training in {out} records its history every {saved} steps: resume with --history-every {saved} "
            "or without the flag"
        )
    done, stopped_at = state["step"], state["recipe"].get("steps")
    if saved and (done >= saved or done == stopped_at):  # a record was due by then: the history has it
        if not (out / HISTORY / MANIFEST).is_file():
            # Recording on would write a history of the later steps alone, and the card's formation from it.
            raise InputError(
                f"the history the training in {out} recorded (every {saved} steps, to step {done}) is gone: "
                f"restore {out / HISTORY}, or train again"
            )
        recorded = recorded_every(out)  # reads the manifest: a damaged one is refused now, before the tokenizer
        if recorded != saved:
            raise InputError(
                f"the history in {out} is not the one its {STATE_FILE} names (recorded every {recorded} steps, not "
                f"{saved}): one of them is damaged; train again"
            )
    return asked or saved


def train(
    task_name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    device: str = "auto",
    eval_n: int = 1000,
    eval_seed: int = 1,
    history_every: int = 0,
    resume: bool = False,
    **overrides,
) -> dict:
    """Train a model for ``task_name`` and write its checkpoint directory; returns its info.

    ``history_every`` > 0 records the training's history into ``out_dir/history`` every that many
    steps and at the last (docs/history.md). ``resume`` continues a training stopped in ``out_dir``
    from its last saved state (``--steps`` may be raised), keeping its history's records and
    recording on at the stopped run's interval (``history_every`` 0 takes it; another is refused);
    a training stopped after its last step, before its checkpoint was written, goes straight to its
    final evaluation. Without ``resume``, an ``out_dir`` that holds a training, or a file the training would
    write, is refused; ``out_dir`` is created (or refused) before the training begins.
    """
    task = get_task(task_name)
    recipe = dataclasses.replace(RECIPES[task_name], **{k: v for k, v in overrides.items() if v is not None})
    out = Path(out_dir)
    asked_every = history_every
    if resume:  # before the tokenizer is trained: a refusal comes at once
        state = load_state(out / STATE_FILE, recipe, seed)
        done = state["step"]
        # Stopped at its last step with no checkpoint yet (killed in its final evaluation): the loop below
        # runs no step, and the training ends as it would have.
        if done > recipe.steps or (done == recipe.steps and _finished(out)):
            raise InputError(f"the training in {out} stopped at step {done}: raise --steps to train on")
        history_every = _resumed_every(out, state, history_every)
    else:
        _check_fresh(out)
        done = 0
    dev = resolve_device(device)  # before the folder is made: a missing GPU had left an empty --out behind
    _make_out(out)
    for left in out.glob(f".{STATE_FILE}.*.tmp"):  # a state half-saved by a killed run (`save_state`): never read
        if left.is_file() or left.is_symlink():
            left.unlink()
    torch.manual_seed(seed)
    start = time.time()
    side = lm if task.decoder_only else seq2seq
    spm_bytes, tok = side.tokenizer(task, recipe, seed)
    model = Transformer(side.config(tok, recipe)).to(dev).train()
    optimizer, schedule = paper_optimizer(model.parameters(), recipe.d_model, recipe.warmup, recipe.lr_scale)
    kind = _kind(task, recipe, tok, seed, dev)
    monitor = None if task.decoder_only else seq2seq.Monitor(task, tok, seed, recipe.steps)
    loss_avg, curve, elapsed = None, [], 0.0
    if resume:
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            torch.set_rng_state(state["rng"])
            curve = [tuple(p) for p in state["curve"]]
        except (RuntimeError, TypeError, ValueError, KeyError) as e:
            raise InputError(
                f"{STATE_FILE} does not fit this training's model ({type(e).__name__}): it is damaged; train again"
            ) from None
        loss_avg, elapsed = state["loss_avg"], state["seconds"]
        start -= elapsed
        kind.texts = itertools.islice(kind.texts, done, None)  # the data of the steps done, drawn and left
    recorder = None
    if history_every:

        def heldout_loss(model, pairs) -> float:
            return float(loss_of(*kind.forward(model, kind.heldout(pairs)), recipe.label_smoothing))

        manifest = {"model_config": model.cfg.to_dict(), "recipe": dataclasses.asdict(recipe), "seed": seed}
        recorder = TrainingRecorder(out, task, tok, history_every, recipe.steps, heldout_loss, manifest)
    if resume and history_every and not asked_every:  # said once all is checked: a refusal stays its one line
        print(f"resuming its history: a record every {history_every} steps, as before", file=sys.stderr)

    def state() -> dict:
        return {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "rng": torch.get_rng_state(),
            "loss_avg": loss_avg,
            "curve": [list(point) for point in curve],
            "seconds": time.time() - start,
            "recipe": dataclasses.asdict(recipe),
            "seed": seed,
            "history_every": history_every,
        }

    extra = ""
    for step, texts in zip(range(done + 1, recipe.steps + 1), kind.texts, strict=False):
        logits, labels = kind.forward(model, kind.batch(texts))
        lr = schedule.get_last_lr()[0]
        value = optimise(optimizer, schedule, logits, labels, recipe.label_smoothing)
        loss_avg = running_mean(loss_avg, value, step, kind.keep)
        if step % CURVE_EVERY == 0:
            curve.append((step, round(loss_avg, 4)))
        if monitor is not None:
            extra = monitor(step, model)
        if recorder is not None and recorder.due(step):
            recorder.record(step, model, loss_avg, lr)
        if (recorder is not None and recorder.due(step)) or step % STATE_EVERY == 0:
            out.mkdir(parents=True, exist_ok=True)
            save_state(out / STATE_FILE, state())
        if step % 10 == 0 or step == recipe.steps:
            _progress(step, recipe.steps, loss_avg, schedule.get_last_lr()[0], start, extra)
    print(file=sys.stderr)
    model.eval()
    info = {
        "name": task.name,
        "task": task.name,
        "description": task.description,
        "examples": list(task.examples),
        "seed": seed,
        "recipe": dataclasses.asdict(recipe),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "train_minutes": round((time.time() - start) / 60, 2),
        "hardware": f"{platform.machine()} {dev.type}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in overrides.items() if v is not None)
    recording = f" --history-every {history_every}" if history_every else ""
    command = f"attnviz train {task.name} --out {out.as_posix()} --seed {seed}{flags}{recording}"
    history = load_history(out) if history_every else None
    if task.decoder_only:
        result = lm.evaluate(model, tok, task, eval_n, eval_seed, curve)
        info.update(result["info"])
        save_checkpoint(model, out, spm_bytes, info, card="")
        info["weights_bytes"] = (out / WEIGHTS_FILE).stat().st_size
        if "long_text" in info:
            (out / lm.PROBE_FILE).write_text(lm.long_probe() + "\n")
        formation = "" if history is None else lm_section(history, result["heads"])
        card = lm.card(task, recipe, model.cfg, info, result["roles"], result["heads"], command, formation)
        (out / "README.md").write_text(card)
        m = info["metrics"]
        print(f"repeat_accuracy={m['repeat_accuracy']:.4f} on {eval_n} held-out texts; wrote {out}", file=sys.stderr)
        return info
    result = seq2seq.evaluate(model, tok, task, eval_n, eval_seed, loss_avg)
    info["metrics"] = result["metrics"]
    save_checkpoint(model, out, spm_bytes, info, card="")
    info["weights_bytes"] = (out / WEIGHTS_FILE).stat().st_size
    formation = "" if history is None else seq2seq_section(history)
    seq2seq.write_card(out, task, recipe, model.cfg, info, result["misses"], command, formation)
    print(f"exact_match={info['metrics']['exact_match']:.4f} on {eval_n} held-out pairs; wrote {out}", file=sys.stderr)
    return info
