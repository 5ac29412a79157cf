"""`attnviz train` and `attnviz evaluate` on bad input: a refusal of one line (exit 2) before any work, for an --out
that holds a user's files or cannot be written, a damaged saved state, a history gone or damaged, a task the model's
tokenizer cannot read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnviz.cli import main
from attnviz.training import loop, seq2seq
from attnviz.training.history import HISTORY, MANIFEST
from attnviz.training.loop import STATE_FILE

# The recipe made tiny: the CLI exposes only --steps, --batch-size and --lr-scale, so each test's `attnviz train`
# runs through a train() that adds the rest (as tests/test_history.py does).
TINY = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32, batch_size=4, warmup=10, spm_sentences=200)
REAL_TRAIN = loop.train


def _tiny_train(task, out, **kwargs):
    torch.set_num_threads(1)
    return REAL_TRAIN(task, out, **{**kwargs, **TINY})


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(loop, "train", _tiny_train)


def _no_work(monkeypatch):
    """Make any training fail loudly: a refusal must come before the tokenizer is trained."""

    def work(*args, **kwargs):
        raise AssertionError("the training began before the refusal")

    monkeypatch.setattr(seq2seq, "tokenizer", work)


def _refused(capsys, argv: list[str]) -> str:
    """The one line of a refusal (exit 2), checked to be the only output on stderr."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("attnviz: error: ") and err.count("\n") == 1 and out == "", (out, err)
    return err


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A tiny training of 2 steps recorded every step: its --out, with its history and saved state."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    _tiny_train("reverse", out, steps=2, eval_n=2, history_every=1)
    return out


def _copy(stopped, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


RESUME = ["--resume", "--steps", "4", "--eval-n", "2"]


# ---------------------------------------------------------------------------------------------
# 1. an --out holding files the training would write


@pytest.mark.parametrize("name", ["README.md", "config.json", "spm.model", "probe.txt"])
def test_train_refuses_an_out_that_holds_a_file_it_would_write(tmp_path, capsys, monkeypatch, tiny, name):
    """A user's README.md and config.json had been replaced by the model card and config, with exit status 0."""
    _no_work(monkeypatch)
    out = tmp_path / "proj"
    out.mkdir()
    (out / name).write_text("the user's own\n")
    err = _refused(capsys, ["train", "reverse", "--out", str(out), "--steps", "2", "--eval-n", "2"])
    assert name in err and "another --out" in err, err
    assert [p.name for p in out.iterdir()] == [name] and (out / name).read_text() == "the user's own\n"


def test_train_into_a_folder_with_unrelated_files_keeps_them(tmp_path, capsys, tiny):
    out = tmp_path / "proj"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert main(["train", "reverse", "--out", str(out), "--steps", "2", "--eval-n", "2"]) == 0
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------
# 2. an --out that cannot be written: checked before the training


def test_train_refuses_a_dangling_link_as_out_before_training(tmp_path, capsys, monkeypatch, tiny):
    """The whole training and evaluation had run, then exit 2 with two lines (progress, `[Errno 17] File exists`)."""
    _no_work(monkeypatch)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nonexistent" / "dir")
    err = _refused(capsys, ["train", "reverse", "--out", str(link), "--steps", "2", "--eval-n", "2"])
    assert "link" in err and "does not exist" in err, err


def test_train_refuses_an_out_under_a_file_naming_the_file(tmp_path, capsys, monkeypatch, tiny):
    """It had said the file "does not exist: create it first"."""
    _no_work(monkeypatch)
    (tmp_path / "file").write_text("x")
    err = _refused(capsys, ["train", "reverse", "--out", str(tmp_path / "file" / "run"), "--steps", "2"])
    assert "is a file, not a folder" in err, err


def test_train_on_a_device_this_machine_lacks_makes_no_out_folder(tmp_path, capsys, monkeypatch):
    """It had said so in one line, and left the --out folder it had made, empty, behind."""
    import torch

    _no_work(monkeypatch)
    missing = "mps" if not torch.backends.mps.is_available() else "cuda" if not torch.cuda.is_available() else None
    if missing is None:
        pytest.skip("this machine has every device --device names")
    err = _refused(capsys, ["train", "reverse", "--out", str(tmp_path / "new"), "--device", missing, "--steps", "2"])
    assert missing in err.lower() and not (tmp_path / "new").exists(), err


@pytest.mark.parametrize("where", ["a dangling link", "under a file"])
def test_train_called_from_python_refuses_an_out_it_cannot_create_before_training(tmp_path, monkeypatch, where):
    from attnviz.errors import InputError

    _no_work(monkeypatch)
    if where == "a dangling link":
        out = tmp_path / "dangling"
        out.symlink_to(tmp_path / "nonexistent" / "dir")
    else:
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "run"
    with pytest.raises(InputError):
        loop.train("reverse", out, steps=2, eval_n=2)


# ---------------------------------------------------------------------------------------------
# 3. a saved state with damaged values


@pytest.mark.parametrize(
    "key, value",
    [
        ("step", -5),
        ("step", True),
        ("history_every", -3),
        ("history_every", True),
        ("seconds", float("nan")),
        ("seconds", -1.0),
        ("loss_avg", float("inf")),
        ("seed", True),
        ("curve", [["a", 1.0]]),
    ],
    ids=str,
)
def test_a_saved_state_with_damaged_values_is_refused_in_one_line(
    tmp_path, capsys, monkeypatch, tiny, stopped, key, value
):
    """``"step": -5`` had been exit 3 (islice), ``"history_every": -3`` exit 3 (recording.py), ``"step": true``
    step 1, ``"seconds": NaN`` a config.json of invalid JSON."""
    _no_work(monkeypatch)
    out = _copy(stopped, tmp_path)
    state = torch.load(out / STATE_FILE, weights_only=True)
    torch.save({**state, key: value}, out / STATE_FILE)
    err = _refused(capsys, ["train", "reverse", "--out", str(out), *RESUME])
    assert STATE_FILE in err and "damaged" in err and key in err, err


# ---------------------------------------------------------------------------------------------
# 4, 5. the history of a resumed training: damaged, or gone


@pytest.mark.parametrize("damage", ["not JSON", "another interval"])
def test_a_resume_whose_history_is_damaged_says_one_line(tmp_path, capsys, monkeypatch, tiny, stopped, damage):
    """The line "resuming its history: a record every 1 steps, as before" had come before the refusal."""
    _no_work(monkeypatch)
    out = _copy(stopped, tmp_path)
    manifest = out / HISTORY / MANIFEST
    if damage == "not JSON":
        manifest.write_text("{not json")
    else:
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "every": 5}))
    err = _refused(capsys, ["train", "reverse", "--out", str(out), *RESUME])
    assert "manifest" in err if damage == "not JSON" else "recorded every 5 steps, not 1" in err, err


def test_a_resume_whose_history_was_deleted_is_refused(tmp_path, capsys, monkeypatch, tiny, stopped):
    """It had trained on and written a new history of the later steps alone, the card's formation built on it."""
    _no_work(monkeypatch)
    out = _copy(stopped, tmp_path)
    shutil.rmtree(out / HISTORY)
    err = _refused(capsys, ["train", "reverse", "--out", str(out), *RESUME])
    assert "history" in err and "gone" in err, err
    assert not (out / HISTORY).exists()


def test_a_resume_says_it_keeps_recording_once_it_is_checked(tmp_path, capsys, tiny, stopped):
    out = _copy(stopped, tmp_path)
    assert main(["train", "reverse", "--out", str(out), *RESUME]) == 0
    err = capsys.readouterr().err
    assert "resuming its history: a record every 1 steps, as before" in err, err


# ---------------------------------------------------------------------------------------------
# 6. evaluate: a task whose text the model's tokenizer cannot read


def test_evaluate_refuses_a_task_the_models_tokenizer_cannot_read(tmp_path, capsys):
    """A reverse model whose config names en-de had printed exact_match=0.0000, exit 0: every input unknown."""
    from attnviz.checkpoints.catalog import pretrained_dir

    model = tmp_path / "mislabelled"
    shutil.copytree(pretrained_dir() / "reverse", model, ignore=shutil.ignore_patterns("history"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "task": "en-de"}))
    err = _refused(capsys, ["evaluate", "--model", str(model), "--n", "2"])
    assert "'en-de'" in err and "cannot read" in err, err


def test_a_training_killed_before_its_first_record_starts_again_without_resume(tmp_path, capsys, monkeypatch):
    """It left history/records/ empty: a new training there was refused as "holds a training (history)", and
    --resume as "nothing to resume": only deleting the folder by hand went on. A history with a record still counts."""
    _no_work(monkeypatch)
    out = tmp_path / "early"
    (out / "history" / "records").mkdir(parents=True)
    (out / "history" / "records" / ".tmp-000000001").mkdir()  # what a killed write may leave
    with pytest.raises(AssertionError, match="the training began"):  # past every refusal
        loop.train("reverse", out, steps=2, eval_n=2)
    (out / "history" / "records" / "000000001").mkdir()
    err = _refused(capsys, ["train", "reverse", "--out", str(out), "--steps", "2"])
    assert "holds a training (history): add --resume" in err, err


def test_a_state_half_saved_by_a_killed_run_is_removed_when_the_training_starts_again(tmp_path, monkeypatch):
    """save_state writes .train_state.pt.<pid>.tmp, then renames it: a kill between left it there for good."""
    _no_work(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    half = out / f".{loop.STATE_FILE}.12345.tmp"
    half.write_bytes(b"half a state")
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(AssertionError, match="the training began"):
        loop.train("reverse", out, steps=2, eval_n=2)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
