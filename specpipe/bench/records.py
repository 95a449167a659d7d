"""What the bench measures, per generation (`Measured`) and per prompt (`PromptResult`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specpipe.pipeline import Generation


@dataclass
class Measured:
    """One generation: its output and what it cost."""

    token_ids: list[int]
    tokens_per_s: float
    time_per_token_s: list[float] = field(default_factory=list)  # per emitted token (empty: unknown)
    stats: dict | None = None  # Stats.to_dict() of specpipe runs

    @classmethod
    def of(cls, gen: Generation) -> Measured:
        return cls(gen.token_ids, gen.stats.tokens_per_s, gen.stats.time_per_token_s, gen.stats.to_dict())


@dataclass
class PromptResult:
    id: str
    category: str
    prompt_tokens: int
    baseline: Measured
    speculative: Measured
    peers: dict[str, Measured] = field(default_factory=dict)
    exact: bool | None = None  # greedy: token-identical to the plain target; sampling: None
    divergence: dict | None = None  # index, tokens and the plain target's top-2 gap where they part
    peers_exact: dict[str, bool | None] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.speculative.tokens_per_s / self.baseline.tokens_per_s

    def to_dict(self) -> dict:
        out = asdict(self)
        out["speedup"] = self.speedup
        return out

    @classmethod
    def from_dict(cls, data: dict) -> PromptResult:
        """A result as `to_dict` wrote it (an interrupted bench's kept prompts, read back to resume)."""
        fields = {k: v for k, v in data.items() if k != "speedup"}
        fields["baseline"], fields["speculative"] = Measured(**data["baseline"]), Measured(**data["speculative"])
        fields["peers"] = {name: Measured(**m) for name, m in data.get("peers", {}).items()}
        return cls(**fields)
