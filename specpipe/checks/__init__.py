"""Compatibility checks, run before any weights load (and by `specpipe check`).

Each check returns `Check(name, status, why, fix)` with status ok / warn / refuse / n/a; the
build refuses a configuration with any `refuse`, `specpipe check` prints them all. The choices
they judge (engine, device, precision, draft...) are read from the config's resolved `Settings`
(specpipe/settings.py), the value the build runs; the config itself only for the raw values the
`settings` check ranges and the components' options. Only tokenizers and configs are read here
(for the draft's vocabulary), never weights.

  result      Check, refuse_if_any
  identity    which components a config names (no rules)
  validate    settings and component options against their ranges and types
  tokenizers  a second model's tokenizer against the target's
  target      early exit, adapters, precision, engine and device, memory
  proposer    the proposer's declaration, sampling, heads, early stop, batching
  machine     this machine against the one a recipe was tuned on (measured.tuned_on)
  run         run_checks: the one list every command shares
"""
