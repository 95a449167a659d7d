"""The decode loop (one, batch-first: a single sequence is a batch of one) and what it needs
around it: text in and out, and step timing."""
