"""The vision transformers of tools/make_onnx_fixtures.py: timm-style attention (a 5-D reshape
and permute that move the batch off axis 0), nn.MultiheadAttention, a relative-position bias
gathered from a learned table."""
import torch
from torch import nn


class Attention(nn.Module):
    """timm's ViT attention: one Linear to q, k and v, reshaped to 5-D and permuted (the batch
    to axis 1), unbound, q k^T scaled, softmax over the last axis, times v, heads merged back."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class RelPosAttention(Attention):
    """Attention with a learned relative-position bias, as Swin and BEiT add it: a table of
    (2w-1)^2 rows (one per offset) x heads, gathered by a fixed int64 index buffer, viewed,
    permuted and added to q k^T before the softmax."""

    def __init__(self, dim, heads, window):
        super().__init__(dim, heads)
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * window - 1) ** 2, heads) * 0.5)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window),
                                            indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("relative_position_index", rel[..., 0] * (2 * window - 1) + rel[..., 1])

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        bias = bias.view(n, n, -1).permute(2, 0, 1).contiguous()
        attn = ((q @ k.transpose(-2, -1)) * self.scale + bias.unsqueeze(0)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class RelPosViT(nn.Module):
    """Patches as tokens (no class token), one block with a relative-position bias, the head on
    the tokens' mean (ReduceMean over axis 1)."""

    def __init__(self, dim=24, heads=3):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RelPosAttention(dim, heads, 4)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = x + self.attn(self.norm1(x))
        return self.head(self.norm(x).mean(1))


class Block(nn.Module):
    """A pre-norm transformer block; attention is timm's, or nn.MultiheadAttention."""

    def __init__(self, dim, heads, mha):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mha = mha
        self.attn = (nn.MultiheadAttention(dim, heads, batch_first=True) if mha
                     else Attention(dim, heads))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + (self.attn(h, h, h, need_weights=False)[0] if self.mha else self.attn(h))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small vision transformer: 8x8 patches by a strided Conv, flatten(2).transpose(1, 2),
    a class token expanded over the batch and concatenated, a learned positional embedding,
    two blocks, a final LayerNorm and the head on x[:, 0]."""

    def __init__(self, mha, dim=24, heads=3):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, 17, dim) * 0.5)
        self.blocks = nn.Sequential(Block(dim, heads, mha), Block(dim, heads, mha))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])
