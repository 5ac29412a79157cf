"""The notebook views against hostile input: what other libraries hand over by mistake, and values set from the
front end. Each test names what had happened before; every refusal is one InputError that says what to pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import toy_export

pytest.importorskip("anywidget")

from test_notebook import _own_decoding, hf_attentions  # noqa: E402

from attnviz.errors import InputError  # noqa: E402
from attnviz.notebook import head_view, model_view, step_view  # noqa: E402

TOKENS = [f"t{i}" for i in range(6)]


# ---------------------------------------------------------------------------------------------
# Values set from the front end (or from Python) on a live view


@pytest.mark.parametrize(("name", "value"), [("layer", 99), ("layer", 0), ("head", -1), ("kind", "decoder")])
def test_a_refused_choice_leaves_the_view_on_what_it_shows(name, value):
    """A refused layer, head or kind had stayed in the trait: every later choice (a contrast, say) was refused
    again with the same message, and the state a saved page opens on named a head that does not exist."""
    view = head_view(hf_attentions(causal=False), TOKENS, kind="encoder", mode="widget")
    setattr(view, name, value)
    assert "counted from 1" in view.error or "no decoder attention" in view.error
    assert (view.kind, view.layer, view.head) == ("encoder", 1, 1)
    assert (view.frame["kind"], view.frame["layer"], view.frame["head"]) == ("encoder", 1, 1)
    view.contrast = "log"
    assert not view.error and view.frame["contrast"] == "log"
    assert view.state()["layer"] == 1 and "attnviz" in view.html()


def test_a_model_view_given_a_kind_its_maps_lack_shows_a_message_not_a_traceback(tmp_path):
    """The model view's grid followed the kind trait itself: a kind it lacks raised an InputError out of the trait
    observer (a traceback in the kernel when the front end sent it), and save(.html) then failed with an
    AttributeError."""
    view = model_view(hf_attentions(causal=False), TOKENS, kind="encoder", mode="widget")
    grid = bytes(view.grid)
    view.kind = "cross"
    assert "no cross attention" in view.error
    assert view.kind == "encoder" and view.grid_info["grid_kind"] == "encoder" and bytes(view.grid) == grid
    view.save(tmp_path / "model.html")
    view.contrast = "row"
    assert not view.error and view.grid_info["grid_kind"] == "encoder" and bytes(view.grid) != grid


def test_a_choice_sent_from_the_front_end_is_put_back_when_refused():
    """As ipywidgets applies a front end's message (set_state): the refused value does not stay in Python."""
    view = model_view(toy_export(), mode="widget")
    view.set_state({"kind": "encoder", "layer": 7, "head": 1})
    assert "counted from 1" in view.error
    assert (view.kind, view.layer) == (view.frame["kind"], view.frame["layer"]) == ("cross", 1)
    view.set_state({"kind": "encoder", "layer": 2, "head": 3})
    assert not view.error and view.grid_info["grid_kind"] == "encoder" and view.frame["title"].endswith("2, head 3")


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"layer": 1.5}, "'layer' trait of a HeadView instance expected an int, not the float 1.5"),
        ({"layer": 2, "head": "3"}, "'head' trait of a HeadView instance expected an int, not the str '3'"),
        ({"layer": "x" * 100_000}, "layer must be an int; got a string of 100,000 characters"),
        (
            {"zoom": [1, 2, 3, "y" * 100_000]},
            "zoom must be a list, each item an int; got [1, 2, 3, a string of 100,000",
        ),
        ({"zoom": list(range(100_000))}, "half-open; got a list of 100,000 items"),
        ({"zoom": [5, 1, 0, 2]}, "half-open; got [5, 1, 0, 2]"),
    ],
)
def test_a_value_of_the_wrong_type_from_the_front_end_is_refused_in_the_view_and_sent_back(state, message):
    """ipywidgets let the TraitError out of set_state (a traceback in the kernel's log) and the page kept the value
    Python had refused. The whole message is refused (no trait of it is set), the view says why in a line that
    does not grow with the value (traitlets' own quotes it whole), and the page is sent Python's values for what
    it sent."""
    view = head_view(hf_attentions(causal=False), TOKENS, kind="encoder", mode="widget")
    sent = []
    view._send = lambda msg, buffers=None: sent.append(msg)
    view.set_state(state)
    assert message in view.error and "\n" not in view.error
    assert len(view.error) < 300
    assert (view.layer, view.head, view.zoom) == (1, 1, []) == (view.frame["layer"], view.frame["head"], [])
    back = [msg["state"] for msg in sent if msg["method"] == "update" and set(state) <= set(msg["state"])]
    assert back == [{name: {"layer": 1, "head": 1, "zoom": []}[name] for name in state}]
    view.set_state({"layer": 2})
    assert not view.error and view.frame["layer"] == 2


def test_a_box_past_the_map_from_the_front_end_is_drawn_clipped_and_the_page_told_so():
    """A zoom past the map was drawn clipped to it, but the trait, and the page, kept the box asked for: the state
    said [1, 2, 3, 100] where the view showed [1, 2, 3, 6], until the next choice."""
    view = head_view(hf_attentions(causal=False), TOKENS, kind="encoder", mode="widget")
    Q, K = view.frame["full"]
    sent = []
    view._send = lambda msg, buffers=None: sent.append(msg)
    view.set_state({"zoom": [1, 2, 3, 100]})
    assert (view.zoom, view.frame["region"], view.error) == ([1, 2, 3, K], [1, 2, 3, K], "")
    zooms = [msg["state"]["zoom"] for msg in sent if "zoom" in msg["state"]]
    assert zooms[-1] == [1, 2, 3, K], zooms  # after ipywidgets' echo of the value sent, the box drawn
    view.set_state({"zoom": [0, 1, 0, 2]})  # a box within the map stays as sent
    assert view.zoom == view.frame["region"] == [0, 1, 0, 2]
    assert [msg["state"]["zoom"] for msg in sent if "zoom" in msg["state"]][len(zooms) :] in ([], [[0, 1, 0, 2]])


# ---------------------------------------------------------------------------------------------
# A step view's id_to_token


@pytest.mark.parametrize(
    ("id_to_token", "tgt", "message"),
    [
        pytest.param(lambda i: None, ["<s>", "None"], r"id_to_token\(6\) gave None", id="None"),
        pytest.param(lambda i: i, ["<s>", "6"], r"id_to_token\(6\) gave 6 \(int\)", id="an id"),
        pytest.param(lambda i: f"t{i}".encode(), ["<s>", "t6"], r"gave b't6' \(bytes\)", id="bytes"),
        pytest.param({6: "t6"}.__getitem__, ["<s>", "t6"], r"id_to_token\(7\) raised KeyError", id="a missing id"),
    ],
)
def test_an_id_to_token_that_gives_no_string_is_refused(id_to_token, tgt, message):
    """Tokens id_to_token gave as None or ids had been taken as labels: the view was made, then displaying it
    raised a TypeError (the still picture escapes strings); one raising KeyError was a traceback of its own."""
    with pytest.raises(InputError, match=message):
        step_view(_own_decoding(), src_tokens=list("abc"), tgt_tokens=tgt, id_to_token=id_to_token, mode="widget")


# ---------------------------------------------------------------------------------------------
# Plain maps and tokens


def test_layers_a_fused_kernel_left_empty_are_named():
    """Hugging Face's attentions from SDPA or flash attention are a tuple of None: the message had been 'each layer
    must be (batch, heads, queries, keys) ...; got (), (), ()'."""
    with pytest.raises(InputError, match=r"attentions\[0\] is None.*attn_implementation=\"eager\""):
        head_view((None, None, None), TOKENS, mode="widget")
    attentions = list(hf_attentions())
    attentions[2] = None
    with pytest.raises(InputError, match=r"attentions\[2\] is None"):
        model_view(attentions, TOKENS, mode="widget")


def test_a_dict_of_maps_is_refused_with_what_to_pass():
    """A dict (per-layer maps by name, or a model's whole output) had been refused with numpy's own words:
    "float() argument must be a string or a real number, not 'dict'"."""
    layers = hf_attentions()
    with pytest.raises(InputError, match=r"attentions is a dict of 3 keys.*a tuple or list in layer order"):
        head_view({f"layer_{i}": a for i, a in enumerate(layers)}, TOKENS, mode="widget")
    with pytest.raises(InputError, match=r"pass its 'attentions' \(e\.g\. outputs\.attentions;"):
        head_view({"logits": np.zeros(3), "attentions": layers}, TOKENS, mode="widget")


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param(set(TOKENS), id="a set"),
        pytest.param(dict.fromkeys(TOKENS, 0), id="a dict"),
    ],
)
def test_tokens_in_no_order_of_positions_are_refused(tokens):
    """A set of tokens had been drawn with its labels in the set's own order, a dict with its keys."""
    with pytest.raises(InputError, match="tokens must be a list of strings, one per position"):
        head_view(hf_attentions(causal=False), tokens, kind="encoder", mode="widget")


def test_a_message_about_tokens_does_not_grow_with_them():
    """Tokens of a batch of one text ([tokens]) had been quoted whole in the message: 10,000 tokens, 100 kB."""
    tokens = [f"token{i}" for i in range(10_000)]
    with pytest.raises(InputError, match=r"one is a list of 10,000 items .*one text's tokens") as refused:
        head_view(hf_attentions(causal=False), [tokens], kind="encoder", mode="widget")
    assert len(str(refused.value)) < 400


def test_tensors_with_no_data_or_a_sparse_layout_are_input_errors():
    """A tensor on the meta device had raised torch's NotImplementedError, a sparse one a TypeError."""
    import torch

    layer = torch.tensor(hf_attentions(layers=1)[0])
    with pytest.raises(InputError, match="meta device"):
        head_view([layer.to("meta")], TOKENS, mode="widget")
    sparse = head_view([layer.to_sparse()], TOKENS, mode="widget")  # the same numbers, drawn
    np.testing.assert_array_equal(sparse.weights, head_view([layer], TOKENS, mode="widget").weights)


def test_maps_of_none_say_the_model_gave_none():
    """Hugging Face's outputs.attentions is None unless the model ran with output_attentions=True: passed with its
    tokens, the message had been "tokens goes with attentions; an encoder-decoder takes src_tokens and tgt_tokens"."""
    for view in (head_view, model_view):
        with pytest.raises(InputError, match=r"the maps are None.*output_attentions=True"):
            view(None, TOKENS, mode="widget")
    with pytest.raises(InputError, match="tokens goes with attentions"):  # beside an encoder-decoder's maps
        head_view(None, TOKENS, cross=hf_attentions(causal=False), mode="widget")


def test_a_text_given_as_the_maps_is_refused_in_a_message_of_its_own_size():
    """A text given without a model had been refused with numpy's words, quoting the whole text: a page of text made
    a page of message, and nothing said that a text goes with a model."""
    text = "the cat sat on the mat " * 200
    with pytest.raises(InputError, match=r"attentions is a string of 4,600 characters.*head_view\(model, text\)") as e:
        head_view(text, mode="widget")
    assert len(str(e.value)) < 400
    with pytest.raises(InputError, match="attentions is 'maps.npy'.*ends in .npz"):
        head_view("maps.npy", TOKENS, mode="widget")


@pytest.mark.parametrize("atlas", [None, 42, toy_export()], ids=["None", "a number", "an export"])
def test_an_atlas_view_of_no_atlas_is_an_input_error(atlas):
    """Anything but an atlas or its folder had raised an AttributeError ('int' object has no attribute 'heads')."""
    from attnviz.notebook import atlas_view

    with pytest.raises(InputError, match=r"atlas_view takes an attnviz\.atlas\.Atlas or its folder"):
        atlas_view(atlas, mode="widget")
