"""Terminal views (rich)."""
