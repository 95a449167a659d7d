"""Verifiers: one target forward over a draft decides what is kept (one choice per file)."""
