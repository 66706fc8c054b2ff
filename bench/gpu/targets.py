"""The tensor-core step's targets, each against a peer measured in the same run (standard library).

Every row names the figure, the peer it is divided by, the ratio and the goal; a row whose inputs
did not run says so instead of guessing. Used by summarize.py; tested by tests/test_targets.py.
"""
import os
import re

H100_BF16_DENSE_TFLOPS = 989.4  # H100/H200 SXM datasheet, dense bf16/fp16 tensor core peak
PEER_7B_TFLOPS = 272.0  # MegaTrain: a 7B model trained on one H100 over PCIe (its published figure)

# A 16-bit gradient in, fp32 master read and written, m and v read and written, a 16-bit
# parameter out: bytes CPU Adam moves per parameter (bench_cpu_adam counts the same way).
ADAM_BYTES_PER_PARAM = {"fp32": 2 + 8 + 16 + 2, "bf16": 2 + 8 + 8 + 2}


def offload_run_facts(log_lines):
    """(parameters, optimizer state dtype) from a train log's banner, or (None, None)."""
    params = state = None
    for line in log_lines:
        m = re.match(r"model \S+: (\d+) parameters", line)
        if m:
            params = int(m.group(1))
        m = re.search(r"AdamW on the CPU .* with (\w+) state", line)
        if m:
            state = m.group(1)
    return params, state


def first_bench(by_name, step, name):
    """The first JSON line called `name` that benchmark step `step` printed, or None."""
    return next((b for b in by_name.get(step, {}).get("bench", []) if b.get("name") == name), None)


def compute_ms(m):
    return m["phase_ms"].get("forward", 0.0) + m["phase_ms"].get("backward", 0.0)


def target_rows(by_name, log_lines_of):
    """Rows (target, figure, peer, ratio or None, goal, verdict) for gpu_report.md.

    by_name: step name -> summarize.py's record (with "metrics" and "bench" where present).
    log_lines_of: step name -> that step's log lines.
    """
    rows = []

    def row(target, figure, peer, ratio, goal, at_least=True):
        if ratio is None:
            verdict = "not run"
        else:
            verdict = "met" if (ratio >= goal if at_least else ratio <= goal) else "missed"
        rows.append((target, figure, peer, ratio, ("≥ " if at_least else "≤ ") + f"{goal:g}",
                     verdict))

    metrics = lambda step: by_name.get(step, {}).get("metrics")

    # GPT-2 124M resident: MFU against a large GEMM timed in the same run, and PyTorch's tokens/s.
    res = metrics("resident_124m_bf16")
    gemm = first_bench(by_name, "bench_train_124m_bf16", "train")
    gemm_tflops = gemm["matmul_gflops"] * 1e-3 if gemm and gemm.get("matmul_gflops") else None
    if res and gemm_tflops:
        row("124M bf16 B=16 T=1024 resident: MFU", f"{res['model_tflops']:.1f} TFLOP/s",
            f"cuBLASLt GEMM {gemm_tflops:.0f} TFLOP/s", res["model_tflops"] / gemm_tflops, 0.5)
    else:
        row("124M bf16 B=16 T=1024 resident: MFU", "-", "cuBLASLt GEMM", None, 0.5)
    if res:
        row("same, against the datasheet peak (for reference)", f"{res['model_tflops']:.1f} TFLOP/s",
            f"{H100_BF16_DENSE_TFLOPS:.0f} TFLOP/s", res["model_tflops"] / H100_BF16_DENSE_TFLOPS,
            0.5)
    else:
        row("same, against the datasheet peak (for reference)", "-",
            f"{H100_BF16_DENSE_TFLOPS:.0f} TFLOP/s", None, 0.5)
    torch = first_bench(by_name, "pytorch_124m", "pytorch_gpt2")
    if res and torch:
        row("124M resident: tokens/s vs PyTorch torch.compile", f"{res['tokens_per_s']:.0f} tok/s",
            f"{torch['tokens_per_s']:.0f} tok/s", res["tokens_per_s"] / torch["tokens_per_s"], 1.0)
    else:
        row("124M resident: tokens/s vs PyTorch torch.compile", "-", "PyTorch", None, 1.0)

    # GPT-2 1.5B offloaded with DPU against resident, and against its slowest component.
    off, res_big = metrics("offload_dpu_1558m"), metrics("resident_1558m")
    if off and res_big:
        row("1.5B offload + DPU: practicality", f"{off['tokens_per_s']:.0f} tok/s",
            f"resident {res_big['tokens_per_s']:.0f} tok/s",
            off["tokens_per_s"] / res_big["tokens_per_s"], 0.9)
    else:
        row("1.5B offload + DPU: practicality", "-", "resident", None, 0.9)
    if off:
        # The GPU's share is the resident run's forward + backward where it ran (the offloaded
        # run's forward also holds its waits for uploads), else the offloaded run's own.
        gpu_ms, gpu_from = (compute_ms(res_big), "resident") if res_big else (compute_ms(off), "own")
        parts = {"gpu (" + gpu_from + ")": gpu_ms}
        parts.update({k: off["phase_ms"][k] for k in ("d2h", "adam", "h2d") if k in off["phase_ms"]})
        slowest = max(parts, key=parts.get)
        row("1.5B offload + DPU: step / max(component)", f"{off['step_ms']:.1f} ms",
            f"{slowest} {parts[slowest]:.1f} ms", off["step_ms"] / parts[slowest], 1.1,
            at_least=False)
    else:
        row("1.5B offload + DPU: step / max(component)", "-", "components", None, 1.1, False)

    # CPU Adam inside that step against the machine's memory roofline (the triad on every core).
    triad = first_bench(by_name, "cpu_adam_roofline", "triad")
    params, state = offload_run_facts(log_lines_of("offload_dpu_1558m"))
    adam_ms = off["phase_ms"].get("adam") if off else None
    if triad and params and state in ADAM_BYTES_PER_PARAM and adam_ms:
        gbps = params * ADAM_BYTES_PER_PARAM[state] / (adam_ms * 1e-3) * 1e-9
        row("1.5B offload: CPU Adam in the step vs memory roofline",
            f"{gbps:.1f} GB/s ({params / (adam_ms * 1e6):.2f} Gparam/s, {state} state)",
            f"triad {triad['triad_gbytes_per_s']:.1f} GB/s, {triad['threads']} threads",
            gbps / triad["triad_gbytes_per_s"], 0.8)
    else:
        row("1.5B offload: CPU Adam in the step vs memory roofline", "-", "triad", None, 0.8)

    # 8-bit state against fp32 state alone, fp32 master, the same ISA and threads: its 16 bytes moved
    # per parameter against fp32's 28 promise 1.5x wherever fp32 is memory-bound.
    adam = [b for b in by_name.get("cpu_adam_roofline", {}).get("bench", [])
            if b.get("name") == "cpu_adam" and b.get("master_dtype") == "fp32"]
    q8 = next((b for b in adam if b.get("state_dtype") == "q8"), None)
    fp32 = next((b for b in adam if q8 and b.get("state_dtype") == "fp32"
                 and b.get("isa") == q8.get("isa") and b.get("threads") == q8.get("threads")), None)
    if q8 and fp32:
        row("CPU Adam alone: q8 state vs fp32 state, same threads",
            f"{q8['gparams_per_s']:.2f} Gparam/s ({q8['isa']}, {q8['threads']} threads)",
            f"fp32 state {fp32['gparams_per_s']:.2f} Gparam/s",
            q8["gparams_per_s"] / fp32["gparams_per_s"], 1.5)
    else:
        row("CPU Adam alone: q8 state vs fp32 state, same threads", "-", "fp32 state", None, 1.5)

    def tokens_row(target, step, peer_step, peer_label, goal):
        a, b = metrics(step), metrics(peer_step)
        if a and b:
            row(target, f"{a['tokens_per_s']:.0f} tok/s", f"{peer_label} {b['tokens_per_s']:.0f} tok/s",
                a["tokens_per_s"] / b["tokens_per_s"], goal)
        else:
            row(target, "-", peer_label, None, goal)

    tokens_row("1.5B offload, exact update: practicality", "offload_1558m", "resident_1558m",
               "resident", 0.8)
    tokens_row("1.5B offload + DPU, bf16 state: practicality", "offload_dpu_bf16_1558m",
               "resident_1558m", "resident", 0.9)
    tokens_row("1.5B offload + DPU, bf16 state and master: practicality",
               "offload_dpu_bf16_bf16master_1558m", "resident_1558m", "resident", 0.9)
    tokens_row("1.5B offload + DPU, q8 state: practicality", "offload_dpu_q8_1558m",
               "resident_1558m", "resident", 0.9)
    tokens_row("1.5B offload + DPU, q8 state and bf16 master: practicality",
               "offload_dpu_q8_bf16master_1558m", "resident_1558m", "resident", 0.9)

    # Llama 3.2 1B: against plain PyTorch of the same shape, and offloaded against resident.
    llama, peer = metrics("llama_1b_resident"), first_bench(by_name, "pytorch_llama_1b", "pytorch_llama")
    if llama and peer:
        row("Llama 3.2 1B resident: tokens/s vs PyTorch (SDPA)",
            f"{llama['tokens_per_s']:.0f} tok/s, first loss {llama['losses'][0]:.4f}"
            if llama.get("losses") else f"{llama['tokens_per_s']:.0f} tok/s",
            f"{peer['tokens_per_s']:.0f} tok/s, first loss {peer.get('first_loss', float('nan')):.4f}",
            llama["tokens_per_s"] / peer["tokens_per_s"], 1.0)
    else:
        row("Llama 3.2 1B resident: tokens/s vs PyTorch (SDPA)", "-", "PyTorch", None, 1.0)
    tokens_row("Llama 3.2 1B offload + DPU: practicality", "llama_1b_offload_dpu",
               "llama_1b_resident", "resident", 0.9)
    tokens_row("Llama 3.2 1B offload, exact update: practicality", "llama_1b_offload",
               "llama_1b_resident", "resident", 0.8)
    tokens_row("Llama 3.2 1B offload + DPU, bf16 state: practicality", "llama_1b_offload_dpu_bf16",
               "llama_1b_resident", "resident", 0.9)

    # The largest model at full speed, against MegaTrain's 7B figure on one H100.
    big = metrics("llama_8b_offload_dpu")
    row("Llama 3.1 8B offload + DPU, grad-accum 8: model TFLOP/s",
        f"{big['model_tflops']:.1f} TFLOP/s" if big else "-", f"{PEER_7B_TFLOPS:g} TFLOP/s (MegaTrain 7B)",
        big["model_tflops"] / PEER_7B_TFLOPS if big else None, 1.0)

    tokens_row("124M resident: CUDA Graphs on vs off", "resident_124m_bf16",
               "resident_124m_bf16_eager", "eager", 1.0)
    return rows


def target_section(by_name, log_dir):
    def log_lines_of(step):
        try:
            with open(os.path.join(log_dir, step + ".log"), errors="replace") as f:
                return f.read().splitlines()
        except OSError:
            return []

    lines = ["", "## Targets (each against a peer measured in this run)", "",
             "| target | measured | peer | ratio | goal | |", "|---|---|---|---|---|---|"]
    for target, figure, peer, ratio, goal, verdict in target_rows(by_name, log_lines_of):
        lines.append(f"| {target} | {figure} | {peer} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {goal} | {verdict} |")
    return lines
