"""Proposers: cheap guesses of the next γ tokens (one choice per file)."""
