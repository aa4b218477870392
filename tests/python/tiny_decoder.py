"""A small decoder in plain PyTorch with a paged KV cache: the model of the
connector's end-to-end test on the cpu backend (no GPU, no transformers).

Llama-shaped: token embedding (tied to the output), per layer RMSNorm,
grouped-query attention with rotary positions, RMSNorm and a SiLU-gated
MLP.  K and V of every layer live in pages of ``block_size`` token rows,
``[num_slots, kv_heads, head_dim]`` per layer; a request's block table
names its pages, and attention gathers the keys and values of positions
``0 .. start + n - 1`` through it, so a forward pass from ``start`` reuses
whatever the pages of positions before ``start`` hold: computed earlier,
or loaded from kvdock.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import torch


class TinyDecoder:
    def __init__(self, *, vocab: int = 512, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                 layers: int = 2, ffn: int = 128, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> None:
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / math.sqrt(shape[0])).to(dtype)

        self.vocab, self.hidden, self.heads, self.kv_heads = vocab, hidden, heads, kv_heads
        self.head_dim = hidden // heads
        self.num_layers = layers
        self.dtype = dtype
        self.embed = (torch.randn(vocab, hidden, generator=g)).to(dtype)
        self.layers = [{
            "wq": w(hidden, heads * self.head_dim), "wk": w(hidden, kv_heads * self.head_dim),
            "wv": w(hidden, kv_heads * self.head_dim), "wo": w(heads * self.head_dim, hidden),
            "w1": w(hidden, ffn), "w3": w(hidden, ffn), "w2": w(ffn, hidden),
        } for _ in range(layers)]

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
        ang = pos.to(torch.float32)[:, None] * freq[None, :]
        cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def slots(self, block_table: Sequence[int], block_size: int, begin: int,
              end: int) -> torch.Tensor:
        """The cache slots of positions [begin, end) under block_table."""
        pos = torch.arange(begin, end)
        table = torch.tensor(list(block_table), dtype=torch.int64)
        return table[pos // block_size] * block_size + pos % block_size

    def forward(self, tokens: Sequence[int], start: int, k_cache: List[torch.Tensor],
                v_cache: List[torch.Tensor], block_table: Sequence[int], block_size: int,
                before_layer: Optional[Callable[[int], None]] = None) -> torch.Tensor:
        """Logits of tokens, at positions start .., the pages of positions
        before start holding their K and V already.  before_layer(l) runs
        before layer l reads the cache (a load's wait_layer)."""
        n = len(tokens)
        pos = torch.arange(start, start + n)
        mine = self.slots(block_table, block_size, start, start + n)
        every = self.slots(block_table, block_size, 0, start + n)
        x = self.embed[torch.tensor(list(tokens), dtype=torch.int64)]
        mask = torch.full((n, start + n), float("-inf"), dtype=self.dtype).triu(start + 1)
        rep = self.heads // self.kv_heads
        for l, p in enumerate(self.layers):
            h = self._norm(x)
            q = self._rope((h @ p["wq"]).view(n, self.heads, self.head_dim), pos)
            k = self._rope((h @ p["wk"]).view(n, self.kv_heads, self.head_dim), pos)
            v = (h @ p["wv"]).view(n, self.kv_heads, self.head_dim)
            if before_layer is not None:
                before_layer(l)
            k_cache[l][mine] = k
            v_cache[l][mine] = v
            keys = k_cache[l][every].repeat_interleave(rep, dim=1)    # [t, heads, d]
            vals = v_cache[l][every].repeat_interleave(rep, dim=1)
            att = torch.einsum("nhd,thd->hnt", q, keys) / math.sqrt(self.head_dim) + mask
            o = torch.einsum("hnt,thd->nhd", att.softmax(-1), vals).reshape(n, -1)
            x = x + o @ p["wo"]
            h = self._norm(x)
            x = x + (torch.nn.functional.silu(h @ p["w1"]) * (h @ p["w3"])) @ p["w2"]
        return self._norm(x) @ self.embed.T

    def greedy(self, prompt: Sequence[int], logits: torch.Tensor, steps: int,
               k_cache: List[torch.Tensor], v_cache: List[torch.Tensor],
               block_table: Sequence[int], block_size: int) -> List[int]:
        """steps tokens of greedy decoding after a prompt whose last logits
        are given, its K and V in the pages of block_table (which must have
        room for steps more tokens)."""
        out: List[int] = []
        n = len(prompt)
        nxt = int(logits[-1].argmax())
        for i in range(steps):
            out.append(nxt)
            logits = self.forward([nxt], n + i, k_cache, v_cache, block_table, block_size)
            nxt = int(logits[-1].argmax())
        return out
