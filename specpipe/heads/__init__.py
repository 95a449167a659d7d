"""Draft heads trained on a frozen target's features: Medusa (medusa.py), with their save/load
in the layouts serving engines read (io.py)."""
