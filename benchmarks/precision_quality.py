"""What a target precision changes in what the model says, against its fp32 weights.

Usage: python benchmarks/precision_quality.py MODEL [PRECISION ...] [--prompts=dev] [--limit=10] [--tokens=64]

Per prompt the fp32 model (engine=native, model.quantize=none) decodes `tokens` greedy tokens;
then each precision reads the same prompt and continuation in one forward (teacher forcing) and
is compared with fp32 on every continuation position: top-1 agreement (the share of positions
where its greedy token is fp32's), mean KL(fp32 || precision) in nats, and the mean negative
log-likelihood of fp32's continuation. A precision's greedy output drifts from fp32's at the
first disagreement; speculative decoding then preserves that precision's output exactly, not
fp32's. Not a timing: it may run beside other work.
"""

from __future__ import annotations

import sys

import torch

from specpipe.decode.text import encode
from specpipe.engine.native_model import NativeLM
from specpipe.models.loader import load_model, load_tokenizer, resolve
from specpipe.prompts import load_prompts


def continuation(lm: NativeLM, prompt: list[int], tokens: int) -> list[int]:
    cache = lm.new_cache(1, len(prompt) + tokens + 1)
    logits, _ = lm.forward(torch.tensor([prompt]), [0], cache, last_only=True)
    out = []
    for _ in range(tokens):
        out.append(int(logits[0, -1].argmax()))
        logits, _ = lm.forward(torch.tensor([[out[-1]]]), [len(prompt) + len(out) - 1], cache)
    return out


def scores(lm: NativeLM, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """log-probabilities [len(answer), V] of each answer position, teacher forced."""
    ids = prompt + answer
    cache = lm.new_cache(1, len(ids) + 1)
    logits, _ = lm.forward(torch.tensor([ids]), [0], cache)
    return torch.log_softmax(logits[0, len(prompt) - 1 : -1].double(), -1)


def main(argv: list[str]) -> None:
    options = dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))
    name, *modes = [a for a in argv if not a.startswith("--")]
    source = resolve(name)
    model, tokenizer = load_model(source), load_tokenizer(source)
    prompts = load_prompts(options.get("prompts", "dev"))[: int(options.get("limit", 10))]
    tokens = int(options.get("tokens", 64))
    reference = NativeLM(model, "none", 4096)
    lms = {mode: NativeLM(model, mode, 4096) for mode in modes or ["fp16", "w8a32", "w8a8", "bf16"]}
    totals = {mode: [0, 0.0, 0.0] for mode in lms}  # agreeing positions, KL sum, NLL sum
    positions, nll_fp32 = 0, 0.0
    for prompt in prompts:
        ids = encode(tokenizer, prompt["messages"], chat=True)
        answer = continuation(reference, ids, tokens)
        base = scores(reference, ids, answer)
        picked = torch.tensor(answer)
        positions += len(answer)
        nll_fp32 -= base.gather(1, picked[:, None]).sum().item()
        for mode, lm in lms.items():
            mine = scores(lm, ids, answer)
            totals[mode][0] += int((mine.argmax(-1) == base.argmax(-1)).sum())
            totals[mode][1] += (base.exp() * (base - mine)).sum().item()
            totals[mode][2] -= mine.gather(1, picked[:, None]).sum().item()
    print(f"{name}: {len(prompts)} prompts x {tokens} tokens of fp32's greedy answer ({positions} positions)")
    print(f"| precision | top-1 agreement with fp32 | mean KL (nats) | NLL of fp32's answer |")
    print("|---|---|---|---|")
    print(f"| none (fp32) | 100% | 0 | {nll_fp32 / positions:.4f} |")
    for mode, (agree, kl, nll) in totals.items():
        print(f"| {mode} | {100 * agree / positions:.1f}% | {kl / positions:.2e} | {nll / positions:.4f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
