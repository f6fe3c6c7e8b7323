"""The encode service: images to embeddings with the model's vision tower alone."""
