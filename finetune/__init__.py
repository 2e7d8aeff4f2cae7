"""Finetuning recipes (scripts; run them with `accelerate launch` or `python`, or import their `main`)."""
