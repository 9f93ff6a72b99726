"""A character-level LSTM language model."""

from __future__ import annotations

import torch
from torch import nn


class CharLSTM(nn.Module):
    """Embedding -> ``layers``-layer LSTM -> Linear to the vocabulary.

    Input: int64 tokens ``(N, L)``; output: next-token logits ``(N, L, vocab)``. Each sequence starts
    from a zero state (no state is carried between batches). No dropout.
    """

    def __init__(self, vocab_size: int, embedding: int = 64, hidden: int = 256, layers: int = 1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.lstm(self.embedding(tokens))
        return self.head(outputs)
