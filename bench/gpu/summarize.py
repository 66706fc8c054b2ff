"""Turns run.sh's step records and logs into results.json and gpu_report.md (standard library only).

usage: summarize.py RESULTS_JSONL REPORT_MD RESULTS_JSON LOG_DIR
"""
import json
import os
import re
import sys

from targets import H100_BF16_DENSE_TFLOPS, target_section

WARMUP_STEPS = 3  # steps left out of the means (allocation, cuBLASLt plans, pinned buffers)


def read_lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def prev_tokens(rows, steady):
    i = rows.index(steady[0])
    return rows[i - 1]["tokens"] if i > 0 else 0


def metrics_of(log_dir, name):
    rows = []
    for line in read_lines(os.path.join(log_dir, name + ".metrics")):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    if not rows:
        return None
    steady = rows[WARMUP_STEPS:] if len(rows) > WARMUP_STEPS + 1 else rows[1:] or rows
    mean = lambda k: sum(r.get(k, 0.0) for r in steady) / len(steady)
    phases = sorted(k[:-3] for k in steady[0] if k.endswith("_ms") and k != "step_ms"
                    and not k.endswith("_exposed_ms"))
    m = {
        "steps": len(rows),
        "losses": [r["loss"] for r in rows],
        "grad_norms": [r.get("grad_norm") for r in rows],
        "skipped": sum(1 for r in rows if r.get("skipped")),
        # "tokens" counts from the start of the run: a step's tokens are the difference.
        "tokens_per_s": (steady[-1]["tokens"] - prev_tokens(rows, steady))
        / (sum(r["step_ms"] for r in steady) * 1e-3),
        "step_ms": mean("step_ms"),
        "model_tflops": mean("tflops"),
        "phase_ms": {p: round(mean(p + "_ms"), 2) for p in phases},
        "exposed_ms": {p[:-11]: round(mean(p), 2) for p in steady[0] if p.endswith("_exposed_ms")},
    }
    m["mfu_vs_datasheet"] = m["model_tflops"] / H100_BF16_DENSE_TFLOPS
    return m


def peak_mem_mib(log_dir, name):
    vals = [int(x) for x in read_lines(os.path.join(log_dir, name + ".mem")) if x.strip().isdigit()]
    return max(vals) if vals else None


def peak_rss_gib(log_dir, name):
    vals = [int(x) for x in read_lines(os.path.join(log_dir, name + ".rss")) if x.strip().isdigit()]
    return round(max(vals) / 2**20, 2) if vals else None


def bench_note(b):
    """The figures of one benchmark JSON line, compactly."""
    keys = ("memory", "bytes", "h2d_gbps", "d2h_gbps", "model", "micro_batch", "tokens_per_s",
            "step_ms", "model_gflops", "model_tflops", "matmul_gflops", "ratio_to_matmul",
            "isa", "state_dtype", "threads", "gparams_per_s", "gbytes_per_s",
            "triad_gbytes_per_s", "ratio_to_triad")
    parts = []
    for k in keys:
        if k in b:
            v = b[k]
            parts.append(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
    return ", ".join(parts)


def gtest_counts(lines):
    passed = sum(1 for l in lines if l.startswith("[       OK ]"))
    failed = sorted({l.split()[3] for l in lines if l.startswith("[  FAILED  ]") and "ms)" in l})
    skipped = sum(1 for l in lines if l.startswith("[  SKIPPED ]") and "ms)" in l)
    return passed, failed, skipped


def main():
    results_path, report_path, json_path, log_dir = sys.argv[1:5]
    steps = []
    for line in read_lines(results_path):
        try:
            steps.append(json.loads(line))
        except ValueError:
            pass
    report = ["# GPU report", ""]
    env = read_lines(os.path.join(log_dir, "env.log"))
    info = read_lines(os.path.join(log_dir, "device_info.log"))
    gpu = next((l.strip() for l in info if "NVIDIA" in l and ("H100" in l or "H200" in l or "|" in l)), "")
    report += ["- " + l for l in env] + ([f"- {gpu}"] if gpu else []) + [""]
    report += ["| step | rc | s | result |", "|---|---|---|---|"]
    by_name = {}
    for s in steps:
        name = s["step"]
        lines = read_lines(os.path.join(log_dir, name + ".log"))
        note = ""
        if name.startswith("test_"):
            p, f, k = gtest_counts(lines)
            s.update(passed=p, failed=f, skipped=k)
            note = f"{p} passed, {k} skipped" + (f", FAILED: {' '.join(f)}" if f else "")
            if s["rc"] not in (0, 1) and not f:
                last = [l for l in lines if l.startswith("[ RUN      ]")]
                note += f"; died in {last[-1].split()[-1] if last else '?'}"
        m = metrics_of(log_dir, name)
        if m:
            m["peak_mem_mib"] = peak_mem_mib(log_dir, name)
            m["peak_host_rss_gib"] = peak_rss_gib(log_dir, name)
            s["metrics"] = m
            note = (f"{m['tokens_per_s']:.0f} tok/s, {m['step_ms']:.1f} ms/step, "
                    f"{m['model_tflops']:.1f} TFLOP/s (MFU {100 * m['mfu_vs_datasheet']:.1f}% of "
                    f"{H100_BF16_DENSE_TFLOPS:.0f}), peak {m['peak_mem_mib']} MiB, "
                    + (f"host RSS {m['peak_host_rss_gib']} GiB, " if m["peak_host_rss_gib"] else "")
                    + f"loss {m['losses'][0]:.4f} -> {m['losses'][-1]:.4f}"
                    + (f", {m['skipped']} skipped" if m["skipped"] else ""))
        for l in lines:
            if l.startswith("per step (ms)"):
                s["per_step"] = l
            if l.startswith("sample: "):
                note = l[len("sample: "):]
            if name.startswith("kernel_profile") and l.startswith("|"):  # its table
                s.setdefault("table", []).append(l)
            if l.startswith("{"):
                try:
                    s.setdefault("bench", []).append(json.loads(l))
                except ValueError:
                    pass
        errors = [l for l in lines if "error" in l.lower() and not l.startswith("[")]
        if s["rc"] != 0:
            note += ("; " if note else "") + ("TIMEOUT" if s["rc"] in (124, 137) else f"rc {s['rc']}")
            if errors:
                note += ": " + errors[-1][:300]
        if "bench" in s and not note:
            note = "; ".join(bench_note(b) for b in s["bench"])
        s["note"] = note
        by_name[name] = s
        report.append(f"| {name} | {s['rc']} | {s['seconds']} | {note} |")

    # The same GPT-2 124M steps on GPU and host: relative loss and gradient-norm differences.
    host = by_name.get("check_124m_host_fp32", {}).get("metrics")
    checks = []
    for name, tol in (("check_124m_cuda_fp32", 1e-3), ("check_124m_cuda_bf16", 2e-2),
                      ("check_124m_cuda_bf16_sync", 2e-2)):
        m = by_name.get(name, {}).get("metrics")
        if not (host and m):
            continue
        for i, (a, b) in enumerate(zip(m["losses"], host["losses"])):
            rel = abs(a - b) / abs(b)
            checks.append((f"{name} step {i + 1} loss", a, b, rel, tol))
        for i, (a, b) in enumerate(zip(m["grad_norms"], host["grad_norms"])):
            if a is not None and b:
                rel = abs(a - b) / abs(b)
                checks.append((f"{name} step {i + 1} grad norm", a, b, rel, 5 * tol))
    if checks:
        report += ["", "## GPU against the host backend (same weights and data)", "",
                   "| quantity | GPU | host | rel. diff | tolerance | |", "|---|---|---|---|---|---|"]
        for q, a, b, rel, tol in checks:
            report.append(f"| {q} | {a:.6g} | {b:.6g} | {rel:.2e} | {tol:.0e} | "
                          f"{'ok' if rel <= tol else 'MISMATCH'} |")

    # A resumed run's steps against the same steps of the run that wrote the checkpoint (it ran
    # on uninterrupted; the resumed run takes its timed GEMM choices from the checkpoint).
    resumed = []
    for mode in ("resident", "offload"):
        full = by_name.get(f"ckpt_{mode}", {}).get("metrics")
        res = by_name.get(f"resume_{mode}", {}).get("metrics")
        if full and res and len(res["losses"]) <= len(full["losses"]):
            tail = full["losses"][len(full["losses"]) - len(res["losses"]):]
            diff = max(abs(a - b) for a, b in zip(res["losses"], tail))
            resumed.append((mode, len(res["losses"]), diff))
    if resumed:
        report += ["", "## Resume against the uninterrupted run", "",
                   "| mode | resumed steps | max loss difference |", "|---|---|---|"]
        report += [f"| {m} | {n} | {d:.3g} |" for m, n, d in resumed]

    # Offload practicality: offload tokens/s over resident tokens/s for the same model.
    ratios = []
    for size in ("124m", "350m", "774m", "1558m"):
        res = by_name.get(f"resident_{size}", {}).get("metrics")
        for kind in ("offload", "offload_dpu", "stream"):
            off = by_name.get(f"{kind}_{size}", {}).get("metrics")
            if res and off:
                ratios.append((size, kind, off["tokens_per_s"], res["tokens_per_s"],
                               off["tokens_per_s"] / res["tokens_per_s"]))
    if ratios:
        report += ["", "## Offload practicality (offload tok/s / resident tok/s)", "",
                   "| model | mode | offload tok/s | resident tok/s | ratio |", "|---|---|---|---|---|"]
        report += [f"| {a} | {b} | {c:.0f} | {d:.0f} | {e:.3f} |" for a, b, c, d, e in ratios]
    report += target_section(by_name, log_dir)
    for s in steps:
        if s.get("table"):
            report += ["", f"## Per-kernel GPU time ({s['step']}, Nsight Compute)", ""] + s["table"]
    per_step = [(s["step"], s["per_step"]) for s in steps if "per_step" in s]
    if per_step:
        report += ["", "## Per-phase times (busy and exposed, ms per step)", ""]
        report += [f"- {n}: {l}" for n, l in per_step]
    with open(report_path, "w") as f:
        f.write("\n".join(report) + "\n")
    with open(json_path, "w") as f:
        json.dump(steps, f, indent=1)
    print("\n".join(report))


if __name__ == "__main__":
    main()
