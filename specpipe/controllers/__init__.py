"""γ controllers: pick the draft length of the next step (one choice per file)."""
