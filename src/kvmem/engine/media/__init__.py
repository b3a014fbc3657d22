"""Images: the projector, its embeddings and their prefill."""
