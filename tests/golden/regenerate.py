"""Regenerate the golden attention files of the snapshot tests (run after retraining a model).

    python tests/golden/regenerate.py

For each shipped checkpoint and each of its three fixed inputs this writes
tests/golden/<model>/<index>.npz in the format of `attnviz attention`.
"""

from __future__ import annotations

from pathlib import Path

import attnviz

HERE = Path(__file__).resolve().parent

# Three fixed inputs per shipped model: (source, target or None for the model's own output).
INPUTS = {
    "en-de": [
        ("Thursday, July 2, 1998", None),
        ("twenty-one", "einundzwanzig"),
        ("$1,234.50", None),
    ],
    "reverse": [
        ("a t t e n t i o n", None),
        ("a b c", "c b a"),
        ("q w e r t y u i o p", None),
    ],
}


def golden_path(model: str, index: int) -> Path:
    return HERE / model / f"{index}.npz"


def main() -> None:
    for model, inputs in INPUTS.items():
        bundle = attnviz.load(model, device="cpu")
        (HERE / model).mkdir(exist_ok=True)
        for i, (src, tgt) in enumerate(inputs):
            path = attnviz.attention(bundle, src, tgt).save(golden_path(model, i))
            print(f"wrote {path.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    main()
