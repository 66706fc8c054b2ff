"""Peer measurement for bench_train on a GPU: GPT-2 (same architecture and FLOP count as
offload_train's model: tied LM head, GELU tanh, pre-LayerNorm) trained with torch.compile in bf16
autocast and fused AdamW. Prints one JSON line with tokens/s and model TFLOP/s.

Usage: python3 bench/pytorch_gpt2.py --layers 12 --heads 12 --embd 768 --batch 16 --seq 1024
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytorch_timing import time_steps


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fcproj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.nh, c // self.nh)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, heads, embd, vocab, block):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(block, embd)
        self.blocks = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(embd)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    model = Gpt(a.layers, a.heads, a.embd, a.vocab, a.seq).to(dev)
    n_params = sum(x.numel() for x in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), fused=True)
    step = torch.compile(model)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    sec, losses = time_steps(step, opt, x, y, a.steps)
    tokens_per_s = a.batch * a.seq / sec
    flops_per_token = 6 * n_params + 12 * a.layers * a.embd * a.seq
    print(json.dumps({"name": "pytorch_gpt2", "params": n_params, "batch": a.batch, "seq": a.seq,
                      "step_ms": sec * 1e3, "tokens_per_s": tokens_per_s,
                      "model_tflops": flops_per_token * tokens_per_s * 1e-12,
                      "torch": torch.__version__, "loss": losses[-1]}))


if __name__ == "__main__":
    main()
