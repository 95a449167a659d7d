"""An EAGLE-3 draft head (Li et al. 2025): fused multi-layer target features, one decoder
layer, its own LM head over a draft vocabulary.

Input row i is (feature of position i, embedding of token i+1). From the target, the feature
is the concatenation of three of its layers' hidden states at i (low, middle, high), fused to
the hidden size by `fc`; at later draft steps it is the head's own output at the row before,
which needs no fusing. The decoder layer norms the embedding (`input_layernorm`) and the
feature (`hidden_norm`), attends over their concatenation [embedding, feature] (2H wide),
adds the feature back as the residual (the normed one with `norm_before_residual`), and runs
the MLP. `norm` + `lm_head` turn its output into logits over `draft_vocab_size` tokens; draft
token d is target token d + d2t[d] (`t2d` marks the target tokens that have a draft id).
Unlike EAGLE, no loss ties the output to the target's next feature: it is whatever serves the
next draft step best (the training-time test trains it on its own outputs).

Layout as the `speculators` package saves it and vLLM's `Eagle3LlamaForCausalLM` reads it
(specpipe/heads/speculators.py): `fc.weight` [H, 3H_target], `layers.0.{input_layernorm,
hidden_norm,post_attention_layernorm}.weight`, `layers.0.self_attn.{q,k,v}_proj.weight`
[*, 2H], `o_proj`, `layers.0.mlp.*`, `norm.weight`, `lm_head.weight` [draft vocab, H], `d2t`
[draft vocab] int64, `t2d` [V] bool. Token embeddings are the target's (stored only when a
third-party checkpoint carries its own `embed_tokens`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from specpipe.heads.eagle import MLP, Attention, EagleShape, HeadCache, RMSNorm


@dataclass(frozen=True)
class Eagle3Shape:
    layer: EagleShape  # the decoder layer's shape (vocab_size: the target's)
    target_hidden_size: int
    draft_vocab_size: int
    target_layers: tuple[int, ...]  # vLLM's aux layer ids: hidden states entering these target layers (L: leaving the last)
    norm_before_residual: bool = False

    @classmethod
    def of_target(cls, config, draft_vocab_size: int, target_layers: tuple[int, ...] | None = None,
                  intermediate_size: int | None = None) -> "Eagle3Shape":
        """A layer of the target's own shape, reading vLLM's default layers (2, L/2, L-3)."""
        layers = config.num_hidden_layers
        return cls(EagleShape.of_target(config, intermediate_size), config.hidden_size, draft_vocab_size,
                   tuple(target_layers or default_layers(layers)))

    def as_dict(self) -> dict:
        return {**asdict(self.layer), "target_hidden_size": self.target_hidden_size,
                "draft_vocab_size": self.draft_vocab_size, "target_layers": list(self.target_layers),
                "norm_before_residual": self.norm_before_residual}


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's and speculators' default: the hidden states entering layers 2, L/2 and L-3 (a
    target of fewer than 5 layers, a test's, reads ids 1..L as near those as it can; id L is
    the last layer's output, before the final norm)."""
    return tuple(max(1, min(k, num_layers)) for k in (2, num_layers // 2, num_layers - 3))


def engine_keys(target_layers: tuple[int, ...]) -> tuple[int, ...]:
    """vLLM's aux ids (the input of layer k) as the runner's hidden-state keys (the output of layer k-1)."""
    return tuple(k - 1 for k in target_layers)


class Eagle3Layer(nn.Module):
    def __init__(self, shape: EagleShape, norm_before_residual: bool):
        super().__init__()
        h = shape.hidden_size
        self.input_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, shape.rms_norm_eps)
        self.self_attn = Attention(shape, width=2 * h)
        self.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps)
        self.mlp = MLP(shape)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, features, positions, mask, cache):
        """embeds, features [B, n, H] -> [B, n, H]."""
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        x = torch.cat([self.input_layernorm(embeds), normed], -1)  # [B, n, 2H]
        x = self.self_attn(x, positions, mask, cache, residual=residual)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class Eagle3Head(nn.Module):
    def __init__(self, shape: Eagle3Shape):
        super().__init__()
        self.shape = shape
        h = shape.layer.hidden_size
        self.fc = nn.Linear(len(shape.target_layers) * shape.target_hidden_size, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(shape.layer, shape.norm_before_residual)])
        self.norm = RMSNorm(h, shape.layer.rms_norm_eps)
        self.lm_head = nn.Linear(h, shape.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(shape.layer.vocab_size, dtype=torch.bool))
        self.embed_tokens: nn.Embedding | None = None  # a checkpoint's own embeddings (default: the target's)

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.shape.target_layers

    def set_vocabulary(self, draft_ids: torch.Tensor) -> None:
        """The draft vocabulary: sorted target ids [K] -> d2t offsets and the t2d mask."""
        self.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    @property
    def draft_ids(self) -> torch.Tensor:
        """[K] the target token id of each draft id."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def fuse(self, target_features: torch.Tensor) -> torch.Tensor:
        """[..., 3 H_target] target hidden states (layer order) -> [..., H]."""
        return self.fc(target_features.to(self._dtype))

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None = None, cache: HeadCache | None = None) -> torch.Tensor:
        """embeds [B, n, H], features [B, n, H] (fused, or the head's own earlier outputs);
        positions [B, n] -> outputs [B, n, H], each the next row's feature (see
        `EagleHead.forward` for cache and mask)."""
        dtype = self._dtype
        return self.layers[0](embeds.to(dtype), features.to(dtype), positions, mask, cache)

    def logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """[..., H] -> float32 logits over the draft vocabulary [..., K]."""
        return self.lm_head(self.norm(outputs)).float()

    @property
    def _dtype(self) -> torch.dtype:
        return self.norm.weight.dtype  # a norm: never swapped for a packed kernel
