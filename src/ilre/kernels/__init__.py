"""Tensor hot paths: rotary embeddings, Λ-mask chunk attention, blockwise query->key scoring, pooling."""
