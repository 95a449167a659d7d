"""The `specpipe` commands; `cli.py` dispatches to them."""
