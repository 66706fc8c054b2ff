"""The timing loop both PyTorch peers share (pytorch_gpt2.py, pytorch_llama.py): bf16 autocast,
backward, fused AdamW step; the median step time over the steps after three warm-up ones, each
between two device synchronizations."""
import time

import torch


def time_steps(fwd, opt, x, y, steps, warmup=3):
    """Returns (median seconds per step, every step's loss)."""
    times, losses = [], []
    for i in range(steps + warmup):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        losses.append(float(loss))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], losses
