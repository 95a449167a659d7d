"""A prompt's text as the command line hands it over, held to the rules a prompt file is.

- Bytes: Python decodes argv with the locale's `surrogateescape`, so bytes that are not UTF-8 reach
  a positional prompt as lone surrogates, which the tokenizer cannot encode (after the weights
  have loaded). They are refused here as a prompt file's are: naming the byte and how to convert.
- A leading `-`: an argument is a flag only if it is one of Hydra's; `-5 is negative, right?` is
  text, so a prompt. Something shaped like a flag that Hydra does not know (`--verbose`) is
  refused by name rather than decoded as a prompt or handed to Hydra's grammar.

Not here: which arguments are settings (cli.py, from the config's schema).
"""

from __future__ import annotations

import os
import re

from specpipe.errors import SpecpipeError

# hydra 1.3's flags (`specpipe generate --help`), with and without a value
HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p", "--package", "-r", "--run",
               "-m", "--multirun", "-sc", "--shell-completion", "-cp", "--config-path", "-cn", "--config-name", "-cd",
               "--config-dir", "--experimental-rerun", "-i", "--info"}
_FLAG_SHAPE = re.compile(r"--?[A-Za-z][\w-]*(=\S*)?")  # what reads as a flag, known or not


def decode_text(data: bytes, where: str) -> str:
    """UTF-8 text (a BOM some editors write is not part of the prompt), or one clear error."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SpecpipeError(f"{where} is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}). "
                            "Convert it, e.g. `iconv -f latin1 -t utf-8 FILE`, and pass it again.") from None


def argv_text(arg: str, what: str = "the prompt") -> str:
    """A command-line argument's text, checked as a file's bytes are: undecodable bytes are refused."""
    try:
        arg.encode("utf-8")
        return arg
    except UnicodeEncodeError:  # lone surrogates: the bytes Python could not decode, kept as they came
        data = os.fsencode(arg)
        return decode_text(data, f"{what} {data.decode('utf-8', 'replace')!r}")


def is_flag(arg: str) -> bool:
    """One of Hydra's flags (`-m`, `--cfg`, `--info=defaults`): it goes to Hydra, never into a prompt.
    A flag-shaped argument Hydra does not know is refused; anything else starting with `-` is text."""
    if arg.partition("=")[0] in HYDRA_FLAGS:
        return True
    if _FLAG_SHAPE.fullmatch(arg):
        raise SpecpipeError(f"{arg} is not a flag specpipe or Hydra knows (theirs: -m, --cfg job, --help, ...). If it "
                            f"is a prompt, put it after `--` (specpipe generate -- \"{arg}\") or pass prompt={arg}.")
    return False
