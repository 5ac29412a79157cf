"""The `attnviz` command: translate, attention, evaluate, train. A stable contract for scripts."""

from __future__ import annotations

import argparse
import sys

from attnviz.devices import DEVICE_CHOICES
from attnviz.errors import AttnvizError


def _translate(args) -> None:
    from attnviz.api import load, translate

    print(translate(load(args.model, args.device), args.text, beam=args.beam))


def _attention(args) -> None:
    from attnviz.api import attention, load

    export = attention(load(args.model, args.device), args.src, args.tgt)
    path = export.save(args.out)
    L, H, S, _ = export.encoder.shape
    decoder = "" if export.tgt_ids is None else f", decoder input {len(export.tgt_ids)} tokens"
    print(f"wrote {path}: {L} layers x {H} heads, source {S} tokens{decoder}")


def _evaluate(args) -> None:
    from attnviz.api import load
    from attnviz.data import get_task
    from attnviz.train import exact_match

    bundle = load(args.model, args.device)
    task_name = bundle.info.get("task")
    if not task_name:
        raise AttnvizError(f"model {bundle.name!r} was not trained on a generated task: nothing to evaluate")
    pairs = get_task(task_name).pairs(args.n, args.seed, "heldout")
    em, misses = exact_match(bundle.model, bundle.tokenizer, pairs)
    for src, ref, out in misses[: args.show_misses]:
        print(f"miss: {src!r} -> {out!r} (expected {ref!r})")
    print(f"model={bundle.name} task={task_name} n={args.n} seed={args.seed} held-out pairs")
    print(f"exact_match={em:.4f}")


def _train(args) -> None:
    from attnviz.train import train

    train(
        args.task,
        args.out,
        seed=args.seed,
        device=args.device,
        eval_n=args.eval_n,
        steps=args.steps,
        batch_size=args.batch_size,
        lr_scale=args.lr_scale,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnviz", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p, default_model: str | None = "en-de") -> None:
        p.add_argument(
            "--model",
            default=default_model,
            required=default_model is None,
            help="a shipped model's name (a folder under pretrained/) or a checkpoint directory",
        )
        p.add_argument("--device", default="auto", choices=DEVICE_CHOICES)

    p = sub.add_parser("translate", help="print the model's output for a sentence")
    model_args(p)
    p.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    p.add_argument("text")
    p.set_defaults(run=_translate)

    p = sub.add_parser("attention", help="write every attention map for one sentence to an .npz file")
    model_args(p)
    p.add_argument("--src", required=True, help="source sentence")
    p.add_argument("--tgt", help="target sentence for the decoder input (default: the model's greedy output)")
    p.add_argument("--out", required=True, help="output .npz file")
    p.set_defaults(run=_attention)

    p = sub.add_parser("evaluate", help="exact match on freshly generated held-out pairs")
    model_args(p)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--show-misses", type=int, default=5)
    p.set_defaults(run=_evaluate)

    p = sub.add_parser("train", help="train a model from scratch on generated data")
    p.add_argument("task", help="en-de or reverse")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    p.add_argument("--steps", type=int, help="override the recipe's number of steps")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr-scale", type=float)
    p.add_argument("--eval-n", type=int, default=1000)
    p.set_defaults(run=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except AttnvizError as e:
        print(f"attnviz: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
