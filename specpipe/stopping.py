"""When a generation ends: EOS, a stop string, or max_new_tokens, wherever they fall in a step.

A step emits several tokens at once; the stop rule is applied token by token, exactly as plain
decoding would apply it, so a speculative run stops at the same token as the plain target.
"""

from __future__ import annotations


class StopRule:
    def __init__(self, tokenizer, eos_ids: set[int], stop_strings: list[str], max_new_tokens: int):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.stop_strings = [s for s in stop_strings if s]
        self.max_new_tokens = max_new_tokens

    def cut(self, generated: list[int], new: list[int]) -> tuple[int, str | None]:
        """How many of `new` to keep, and why generation ends after them (None: it goes on)."""
        for i, token in enumerate(new):
            so_far = len(generated) + i + 1
            if token in self.eos_ids:
                return i + 1, "eos"  # EOS is kept in the output, as transformers does
            if self.stop_strings and self._has_stop_string(generated + new[: i + 1]):
                return i + 1, "stop_string"
            if so_far >= self.max_new_tokens:
                return i + 1, "length"
        return len(new), None

    def _has_stop_string(self, ids: list[int]) -> bool:
        tail = self.tokenizer.decode(ids[-32:])  # a stop string spans few tokens
        return any(s in tail for s in self.stop_strings)


def eos_ids_of(runner, tokenizer) -> set[int]:
    """EOS ids from the tokenizer and the model the runner runs (its generation config, or a GGUF's
    vocabulary): instruct models have two, EOS and end of turn."""
    ids = {tokenizer.eos_token_id} | runner.stop_ids()
    return {i for i in ids if i is not None}
