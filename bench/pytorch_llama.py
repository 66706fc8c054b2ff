"""Peer measurement for the Llama family on a GPU: the same architecture and FLOP count as
offload_train's Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied head), in
plain PyTorch eager with scaled_dot_product_attention, bf16 autocast over fp32 parameters and
fused AdamW. Weights drawn N(0, 0.02) as offload_train draws them, so the first step's loss is
comparable with offload_train's (about ln V). Prints one JSON line.

Usage: python3 bench/pytorch_llama.py --batch 4 --seq 2048      (Llama 3.2 1B's shape by default)
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from pytorch_timing import time_steps


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate(x, cos, sin):  # Hugging Face's rotate_half pairing (i, i + hs/2)
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, c, nh, nkv, inter, eps):
        super().__init__()
        self.nh, self.nkv, self.hs, self.eps = nh, nkv, c // nh, eps
        self.n1, self.n2 = nn.Parameter(torch.ones(c)), nn.Parameter(torch.ones(c))
        self.qkv = nn.Linear(c, (nh + 2 * nkv) * self.hs, bias=False)
        self.o = nn.Linear(nh * self.hs, c, bias=False)
        self.gate_up = nn.Linear(c, 2 * inter, bias=False)
        self.down = nn.Linear(inter, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(rms_norm(x, self.n1, self.eps)).split(
            [self.nh * self.hs, self.nkv * self.hs, self.nkv * self.hs], dim=2)
        q = rotate(q.view(b, t, self.nh, self.hs).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, t, self.nkv, self.hs).transpose(1, 2), cos, sin)
        v = v.view(b, t, self.nkv, self.hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        g, u = self.gate_up(rms_norm(x, self.n2, self.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.embd)
        self.blocks = nn.ModuleList(
            Block(a.embd, a.heads, a.kv_heads, a.inter, a.eps) for _ in range(a.layers))
        self.nf = nn.Parameter(torch.ones(a.embd))
        self.head = None if a.tied else nn.Linear(a.embd, a.vocab, bias=False)
        self.eps = a.eps
        hs = a.embd // a.heads
        inv = 1.0 / (a.theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
        ang = torch.arange(a.seq, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), dim=-1).float()
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        x = rms_norm(x, self.nf, self.eps)
        logits = x @ (self.emb.weight if self.head is None else self.head.weight).t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--embd", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--inter", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--theta", type=float, default=5e5)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--untied", dest="tied", action="store_false")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    model = Llama(a).to(dev)
    n_params = sum(x.numel() for x in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), fused=True)
    fwd = torch.compile(model) if a.compile else model
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    sec, losses = time_steps(fwd, opt, x, y, a.steps)
    tokens_per_s = a.batch * a.seq / sec
    flops_per_token = 6 * n_params + 12 * a.layers * a.embd * a.seq  # q width = C here
    print(json.dumps({"name": "pytorch_llama", "params": n_params, "batch": a.batch,
                      "seq": a.seq, "compiled": a.compile, "step_ms": sec * 1e3,
                      "tokens_per_s": tokens_per_s,
                      "model_tflops": flops_per_token * tokens_per_s * 1e-12,
                      "first_loss": losses[0], "peak_mem_gib":
                      torch.cuda.max_memory_allocated() / 2**30, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
