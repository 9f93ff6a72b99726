"""A small causal (decoder-only) Transformer for character-level language modelling.

Attention is written with ``nn.Linear`` projections and
:func:`torch.nn.functional.scaled_dot_product_attention` rather than ``nn.MultiheadAttention``, whose
fused input projection is a bare parameter: keeping every weight in an ``nn.Linear`` lets curvature
optimizers (K-FAC) precondition all of them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` attends to positions ``<= t``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, width = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(n, length, width))


class Block(nn.Module):
    """Pre-norm Transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))`` (MLP 4x wide, GELU)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    """Token + learned position embeddings -> ``layers`` blocks -> LayerNorm -> Linear to the vocabulary.

    Input: int64 tokens ``(N, L)`` with ``L <= context``; output: next-token logits ``(N, L, vocab)``.
    No dropout.
    """

    def __init__(self, vocab_size: int, context: int = 64, width: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)
        for embedding in (self.token_embedding, self.position_embedding):
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(f"sequence length {length} exceeds the context {self.context}")
        positions = torch.arange(length, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.norm(self.blocks(x)))
