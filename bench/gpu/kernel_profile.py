"""Groups Nsight Compute's per-kernel GPU times of one training step as docs/performance.md's
predicted budget for the GPT-2 124M step does, and prints the table (standard library only).

usage: kernel_profile.py NCU_OUTPUT...
NCU_OUTPUT: files that may hold the output of `ncu --csv --metrics gpu__time_duration.sum ...`
(run.sh's profile phase: ncu's --log-file, and the step's log in case ncu printed there); the
first with a CSV header is read, the lines before the header (the program's own output, ncu's
==PROF== lines) skipped. Prints a markdown table and one JSON line with the same figures.
"""
import csv
import json
import re
import sys

# (category, pattern over the demangled kernel name, predicted ms for GPT-2 124M bf16, B=16,
# T=1024 on an H100, from docs/performance.md, or None where the budget names no figure).
# The first matching pattern wins; anything else is a library kernel (cuBLASLt's GEMMs).
CATEGORIES = [
    ("attention forward", r"attention_(tc_)?forward_kernel", None),
    ("attention backward", r"attention_(tc_dkv|tc_dq|backward_\w+)_kernel", None),
    ("LayerNorm / RMSNorm", r"(layernorm|rmsnorm)_\w+_kernel", None),
    ("residual adds and other elementwise ops", r"elementwise_kernel", None),
    ("cross-entropy", r"cross_entropy_kernel", None),
    ("embedding", r"embedding_\w+_kernel|RadixSort|cub::", None),
    ("AdamW", r"adamw_kernel", 1.4),
    ("gradient norm, accumulation, casts, biases, other ops",
     r"sum_squares|accumulate_f32|cast_kernel|bias_\w+_kernel|step_gate"
     r"|nonfinite_flag|rope_kernel|swiglu_kernel|attention_decode", None),
]
GEMMS = ("GEMMs (cuBLASLt and other library kernels)", 24.6)
PREDICTED_GROUPS = [  # rows of the predicted budget that span several categories
    ("attention (forward + backward)", ("attention forward", "attention backward"), (8.0, 14.0)),
    ("LayerNorms, residual adds, cross-entropy, embedding",
     ("LayerNorm / RMSNorm", "residual adds and other elementwise ops", "cross-entropy",
      "embedding"), (3.2, 3.2)),
]

UNIT_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
           "second": 1e9, "s": 1e9}


def kernel_times(lines):
    """[(kernel name, ns)] for every gpu__time_duration.sum row of ncu's CSV output."""
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    out = []
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond").strip()
        if unit not in UNIT_NS:
            raise ValueError(f"unknown time unit '{unit}' for {row.get('Kernel Name')}")
        value = float(row["Metric Value"].replace(",", ""))
        out.append((row["Kernel Name"], value * UNIT_NS[unit]))
    return out


def category_of(name):
    for category, pattern, _ in CATEGORIES:
        if re.search(pattern, name):
            return category
    return GEMMS[0]


def summarize(times):
    """{category: (kernels, ms)} and the total ms."""
    by = {}
    for name, ns in times:
        n, ms = by.get(category_of(name), (0, 0.0))
        by[category_of(name)] = (n + 1, ms + ns * 1e-6)
    return by, sum(ms for _, ms in by.values())


def table(by, total):
    predicted = {c: p for c, _, p in CATEGORIES}
    predicted[GEMMS[0]] = GEMMS[1]
    rows = ["| kernels of one step | launches | measured ms | share | predicted ms |",
            "|---|---:|---:|---:|---:|"]
    for category in [GEMMS[0]] + [c for c, _, _ in CATEGORIES]:
        n, ms = by.get(category, (0, 0.0))
        p = predicted[category]
        rows.append(f"| {category} | {n} | {ms:.2f} | {100 * ms / total if total else 0:.1f}% | "
                    f"{'-' if p is None else f'{p:g}'} |")
    for label, members, (lo, hi) in PREDICTED_GROUPS:
        ms = sum(by.get(m, (0, 0.0))[1] for m in members)
        rows.append(f"| {label} | | {ms:.2f} | {100 * ms / total if total else 0:.1f}% | "
                    f"{lo:g}" + (f"-{hi:g}" if hi != lo else "") + " |")
    rows.append(f"| **all kernels** | {sum(n for n, _ in by.values())} | **{total:.2f}** | 100% "
                "| 37-43 (the step) |")
    return rows


def main():
    for path in sys.argv[1:]:
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        if any(l.startswith('"ID"') for l in lines):
            break
    else:
        raise SystemExit("kernel_profile: no ncu CSV in " + ", ".join(sys.argv[1:]))
    by, total = summarize(kernel_times(lines))
    print("\n".join(table(by, total)))
    print(json.dumps({"name": "kernel_profile", "total_ms": total,
                      "categories": {c: {"launches": n, "ms": ms} for c, (n, ms) in by.items()}}))


if __name__ == "__main__":
    main()
