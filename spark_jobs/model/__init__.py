"""The GPT-style decoder (layers.py: its layers; decoder.py: the model and its cached forward pass)
and its sampler."""
