"""The GPT-style decoder and its sampler."""
