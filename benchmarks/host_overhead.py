"""A plain decode step's host cost: ms a step of plain greedy decoding on a tiny random Llama
(2 layers, hidden 32), whose forward is small enough that the step's Python and tensor
operations around it show. On a GPU each of those operations is a launch besides the target's
graph, so what this measures on the CPU is what a GPU step pays beside its kernels.

    python benchmarks/host_overhead.py --tokens 200 --repeats 7

Prints, for eager steps (`graphs=off`) and static steps (`graphs=on`), the best and median ms
a step over the repeats, and the eager forward alone. One thread; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specpipe.engine import make_runner
from specpipe.models.loader import LoadedModel
from specpipe.pipeline import Pipeline
from specpipe.verifiers.greedy import GreedyVerifier

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def tiny() -> LoadedModel:
    """A random 2-layer Llama of vocabulary 64, no end-of-sequence token to stop it."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(__file__).parent / "shapes" / "tiny-tokenizer.json"))
    return LoadedModel("tiny", model, tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = tiny()
    for graphs in ("off", "on"):
        pipe = Pipeline(target, None, GreedyVerifier(), None, runner=make_runner(target.model, graphs=graphs))
        pipe.run(PROMPT, max_new_tokens=50, speculative=False)  # warm-up
        per_step = []
        for _ in range(args.repeats):
            stats = pipe.run(PROMPT, max_new_tokens=args.tokens, speculative=False).stats
            per_step.append(stats.decode_s / stats.steps * 1000)
        print(f"graphs={graphs}: {min(per_step):.3f} ms a step (median {statistics.median(per_step):.3f}, "
              f"{stats.steps} steps)")
    runner = make_runner(target.model, graphs="off")
    runner.prefill(0, PROMPT)
    block = torch.tensor([[5]])
    started = time.perf_counter()
    for _ in range(args.tokens):
        runner.forward(block)
        runner.commit([1])
    print(f"the eager forward alone: {(time.perf_counter() - started) / args.tokens * 1000:.3f} ms")


if __name__ == "__main__":
    main()
