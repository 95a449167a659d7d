"""Model sources for specpipe: the built-in zoo of pretrained GGUF models (`zoo`)."""
