"""specpipe: declarative speculative decoding for Hugging Face causal LMs."""
