"""Text in and out of a decode: prompts to token ids (through the chat template), and the
incremental detokenisation every streamed event's text comes from."""

from __future__ import annotations

from specpipe.errors import SpecpipeError


def encode(tok, prompt: str | list[dict], chat: bool) -> list[int]:
    """Prompt text (or chat messages) -> token ids, through the chat template when `chat`."""
    if chat:
        from jinja2 import TemplateError, TemplateSyntaxError

        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateSyntaxError as err:
            raise SpecpipeError(f"The model's chat template cannot be read ({err}). Fix its chat_template (in "
                                "tokenizer_config.json), or pass model.chat=false.") from None
        except TemplateError as err:  # e.g. a role the template does not know, or turns out of order
            raise SpecpipeError(f"The model's chat template refused the prompt's messages ({err}). Use the roles and "
                                "turn order it expects (system, user, assistant), or pass model.chat=false.") from None
        return tok(text, add_special_tokens=False)["input_ids"]
    text = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)
    return tok(text)["input_ids"]


def is_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], int)


class TextStream:
    """Incremental detokenization: each step decodes a short window of recent tokens, not the
    whole output (which made the text of a long generation cost O(n²)). The window starts at
    the previous step's tokens, so the new ones are decoded in context (a leading space or a
    byte sequence split across steps), and a trailing partial UTF-8 character is held back
    until it completes (vLLM's and TGI's prefix/read offsets)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: tokens before it are already text
        self.read = 0  # tokens whose text has been emitted

    def push(self, new: list[int], final: bool = False) -> str:
        self.ids.extend(new)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        done = decode(self.ids[self.prefix : self.read])
        text = decode(self.ids[self.prefix :])
        if not final and (text.endswith("\ufffd") or len(text) <= len(done)):
            # a multi-byte character still incomplete, or nothing new (a skipped special token):
            # the window stays, so the next token is decoded in its context (its leading space)
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(done) :]
