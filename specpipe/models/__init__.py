"""Models: the built-in zoo (`zoo`), loading from any source (`loader`), precision
(`quantize`), adapters and early exit (`adapters`), and one model with its KV cache (`runner`)."""
