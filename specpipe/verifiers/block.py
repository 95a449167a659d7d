"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh: "Block
Verification Accelerates Speculative Decoding", ICLR 2025, Algorithm 2), batched.

Rejection sampling (rejection.py) judges each draft token alone, so one unlucky token ends the
step even where the prefix as a whole is likely enough under the target. Block verification
judges the draft's prefixes jointly: it keeps the longest prefix that passes a test on the
prefix's capped joint probability ratio, and draws the next token from a residual that
accounts for the target mass the kept prefix already used. The emitted tokens are distributed
exactly as plain sampling from the target (the paper's Theorem 1), and on the same drafts it
keeps at least as many tokens in expectation as rejection sampling, for every target and draft
distribution (Theorem 2; optimal among verifiers of one draft chain). At temperature 0 both
distributions are one-hot and it keeps exactly the target's argmax tokens, as greedy does.
vLLM calls it `rejection_sample_method: block`, SGLang `--speculative-use-block-verification`.

Glossary (one row; draft tokens x_1..x_γ; block row i of the logits predicts token i + 1):
  target_probs_i    the target's distribution after the context and x_1..x_i (i = 0..γ)
  draft_probs_i     the draft's distribution x_{i+1} was drawn from (one-hot on it where the
                    draft has no probabilities: a model-free or greedy drafter)
  weight p_i        p_0 = 1, p_i = min(1, p_{i-1} * target_probs_{i-1}(x_i) / draft_probs_{i-1}(x_i)):
                    the prefix x_1..x_i's joint ratio, capped at 1 at every step
  residual_i        max(0, p_i * target_probs_i - draft_probs_i); its mass Z_i
  acceptance h_i    Z_i / (Z_i + 1 - p_i) for i < γ, and h_γ = p_γ
  kept τ            the LAST i with u_i < h_i (u_i ~ U(0, 1) independent), 0 if none. Unlike
                    rejection sampling, a failed test does not stop the scan: a longer prefix
                    can still pass
  next token        drawn from residual_τ normalised where τ < γ (recovered), from target_probs_γ
                    where τ = γ (bonus)

The uniforms and the next token's race draws are rejection sampling's, from the same streams of
the step's `StepRandom`, so the two verifiers see the same randomness for the same seed and only
the rule differs (`RejectionVerifier.rule`); the graph tail and the verdict are shared too.
Shapes: B rows, W draft columns (row b drafted its first counts[b]), V vocabulary; probabilities
and weights float32, the weights formed in log space; no value is read back to the host.
"""

from __future__ import annotations

import torch

from specpipe.sampling import race
from specpipe.verifiers.rejection import RejectionVerifier, draft_dist

TINY = 1e-30  # the smallest draft probability a ratio divides by (a sampled token never has 0)


class BlockVerifier(RejectionVerifier):
    """Rejection sampling's draws, draft handling, graph tail and verdict, with Algorithm 2 as the rule."""

    name = "block"

    @staticmethod
    def rule(target_probs: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor | None,
             uniform: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num_accepted [B], the recovered or bonus token [B]): `decide`."""
        return decide(target_probs, tokens, counts, probs, uniform, draws)


def decide(target_probs: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor, probs: torch.Tensor | None,
           uniform: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 2 on every row at once. target_probs [B, W + 1, V], tokens [B, W], counts [B],
    the draft's probabilities [B, W, V] (None: one-hot), uniform [B, W] (column c tests the prefix
    of c + 1 tokens), the race's draws [B, V] -> (num_accepted τ [B], the next token [B])."""
    width = tokens.shape[1]
    if width == 0:  # nothing drafted anywhere: the target's own sample
        return torch.zeros_like(counts), race(target_probs[:, 0], draws)
    target_p = target_probs[:, :width].gather(-1, tokens[..., None])[..., 0]  # [B, W] target_probs_{c}(x_{c+1})
    draft_p = torch.ones_like(target_p) if probs is None else probs.gather(-1, tokens[..., None])[..., 0].float()
    weights = prefix_weights(target_p, draft_p)  # [B, W + 1] p_0..p_W
    mass = residual_mass(target_probs[:, :width], tokens, probs, weights[:, :width], target_p)  # [B, W] Z_0..Z_{W-1}
    kept = torch.arange(1, width + 1, device=tokens.device)  # [W] the prefix length column c tests
    passed = uniform < acceptance(weights, mass, counts, kept)  # [B, W]
    num_accepted = torch.where(passed, kept, 0).amax(1)  # [B] the longest passing prefix, not the first failure
    return num_accepted, _next_token(target_probs, tokens, probs, weights, num_accepted, counts, draws)


def prefix_weights(target_p: torch.Tensor, draft_p: torch.Tensor) -> torch.Tensor:
    """target_p, draft_p [B, W]: each draft token's probability under the target and the draft
    -> p_0..p_W [B, W + 1]. In log space the capped product min(0, log p_{i-1} + log ratio_i) is
    a running sum reflected at 0, so log p_i = S_i - max_{j <= i} S_j with S_i the sum of the
    first i log ratios (Lindley's recursion): no loop over columns. A token the target excludes
    makes S -inf from there on, so every longer prefix weighs 0."""
    log_ratio = target_p.log() - draft_p.clamp_min(TINY).log()  # [B, W] in [-inf, +70]: never +inf, so no NaN
    sums = torch.cat([log_ratio.new_zeros(log_ratio.shape[0], 1), log_ratio.cumsum(1)], 1)  # [B, W + 1] S_0 = 0
    return (sums - sums.cummax(1).values).exp()


def residual_mass(target_probs: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None,
                  weights: torch.Tensor, target_p: torch.Tensor) -> torch.Tensor:
    """Z_0..Z_{W-1} [B, W]: the mass of max(0, p_i * target_probs_i - draft_probs_i). target_probs
    [B, W, V], weights p_0..p_{W-1} [B, W]. A one-hot draft needs no [B, W, V] pass: the only
    token it can lower is its own, and p_i * target_probs_i(x_{i+1}) <= 1, so Z_i is
    p_i * (1 - target_probs_i(x_{i+1}))."""
    if probs is None:
        return weights * (1.0 - target_p)
    return (weights[..., None] * target_probs - probs.float()).clamp_min(0.0).sum(-1)


def acceptance(weights: torch.Tensor, mass: torch.Tensor, counts: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """h_1..h_W [B, W] (column c: the prefix of kept[c] = c + 1 tokens): Z_i / (Z_i + 1 - p_i)
    inside a row's draft, p_γ at its last token, 0 past it (never kept). weights p_0..p_W
    [B, W + 1], mass Z_0..Z_{W-1} [B, W]. Where Z_i + 1 - p_i is 0 (p_i = 1 and no residual: the
    target equals the draft there, and every longer prefix has weight 1 and passes at γ) the
    test does not matter; 1 keeps it a number."""
    weight = weights[:, 1:]  # [B, W] p_{c+1}
    mass_next = torch.cat([mass[:, 1:], mass.new_zeros(mass.shape[0], 1)], 1)  # [B, W] Z_{c+1} (unused at c = W - 1)
    denominator = mass_next + (1.0 - weight)
    inside = torch.where(denominator > 0, mass_next / denominator.clamp_min(TINY), 1.0)
    last = kept[None] == counts[:, None]  # [B, W]
    return torch.where(kept[None] < counts[:, None], inside, torch.where(last, weight, 0.0))


def _next_token(target_probs: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None, weights: torch.Tensor,
                num_accepted: torch.Tensor, counts: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """[B]: the recovered token, drawn from max(0, p_τ * target_probs_τ - draft_probs_τ) where the
    row kept fewer than it drafted, else the bonus token from target_probs_τ (τ = γ)."""
    at = num_accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    final = target_probs.gather(1, at)[:, 0]  # [B, V] target_probs_τ
    weight = weights.gather(1, num_accepted[:, None])  # [B, 1] p_τ
    residual = (weight * final - draft_dist(tokens, probs, num_accepted, final)).clamp_min(0.0)  # [B, V]
    # where rounding left the residual no mass, the target's own distribution
    recovered = (num_accepted < counts)[:, None] & (residual.sum(-1, keepdim=True) > 0)  # [B, 1]
    return race(torch.where(recovered, residual, final), draws)  # the race needs no normalising


def build(*, context) -> BlockVerifier:
    return BlockVerifier(context.sampling)


def _vllm(settings: dict, version: str) -> list[str]:
    settings["rejection_sample_method"] = "block"  # its rejection sampler's block rule, for every method
    return []


SGLANG_BLOCK = ("EAGLE", "EAGLE3", "NEXTN")  # the algorithms SGLang 0.5.23 verifies by blocks (top-k 1 chains)


def _sglang(flags: dict, version: str) -> list[str]:
    algorithm = flags["--speculative-algorithm"]
    if algorithm in SGLANG_BLOCK and flags.get("--speculative-eagle-topk") == 1:
        flags["--speculative-use-block-verification"] = True
        return []
    return [f"verifier=block: SGLang {version} verifies blocks for {', '.join(SGLANG_BLOCK)} chains (top-k 1) only "
            f"and refuses the flag with {algorithm}: not written, so it verifies token by token (lossless, fewer "
            "tokens kept a step)."]


EXPORT = {"vllm": _vllm, "sglang": _sglang}  # read by the exporters (export/plan.py)
