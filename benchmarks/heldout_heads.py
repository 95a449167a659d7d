"""Several EAGLE-3 heads' held-out accuracy on the same cached answers, drafted as the proposer does.

Each `specpipe train` run measures its head on its own last sequences, so two runs with other
budgets report figures over other answers. This puts heads side by side on one set: the last
`--last` sequences of a feature cache folder (~/.cache/specpipe/features/<model>-<key>), none of
which any of the heads trained on when `--last` is at most the newest run's held-out share.

    python benchmarks/heldout_heads.py --model qwen2.5-coder-1.5b --features DIR --count 280 --last 14 \
        HEADS_DIR [HEADS_DIR ...]

Prints per head P(draft tokens 1..k all right), k = 1..depth, and held-out τ = 1 + their sum.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specpipe.commands.train import _target_weights
from specpipe.errors import SpecpipeError
from specpipe.heads.speculators import load_eagle3
from specpipe.models.loader import resolve
from specpipe.train import features
from specpipe.train.drafting import FrozenTarget
from specpipe.train.eagle3 import held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--features", type=Path, required=True, help="a feature cache folder of that model")
    parser.add_argument("--count", type=int, required=True, help="the sequences the folder's run cached")
    parser.add_argument("--last", type=int, default=14, help="held-out: this many sequences at the end")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--per-sequence", type=int, default=16, help="draft starts per held-out sequence")
    parser.add_argument("heads", nargs="+", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    cached = features.load(args.features, args.count) if args.features.is_dir() else []
    if len(cached) < args.count or not 0 < args.last <= args.count:
        parser.error(f"--features {args.features} holds {len(cached)} cached sequences, and --count {args.count} "
                     f"with --last {args.last} needs {args.count}: pass a feature cache folder of a train run "
                     "(~/.cache/specpipe/features/<model>-<key>) and at most its sequence count.")
    try:
        weights = _target_weights(resolve(args.model))
        target = FrozenTarget(weights.embed.float(), weights.lm.float())
        for folder in args.heads:
            acc = held_out(load_eagle3(folder).float(), target, cached[-args.last :], args.depth, args.per_sequence)
            print(f"{folder}: P(1..k right) {' '.join(f'{a:.3f}' for a in acc)}  held-out τ {1 + sum(acc):.3f}")
    except SpecpipeError as exc:
        parser.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    main()
