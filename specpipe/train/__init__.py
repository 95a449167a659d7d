"""`specpipe train`: heads for a frozen target. data.py (offline corpora), features.py (the
target's features computed once, cached on disk), medusa.py (the training loop)."""
