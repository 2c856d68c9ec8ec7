"""Training cost: exact BitOPs per layer and pass, and the hardware cost models (docs/methods.md §2, §10)."""
