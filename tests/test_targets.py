"""bench/gpu/targets.py and summarize.py on made-up step records: every ratio against numbers
worked out here by hand, and the whole report from a log directory as run.sh leaves it."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_BENCH = os.path.join(HERE, "..", "bench", "gpu")
sys.path.insert(0, GPU_BENCH)
import targets  # noqa: E402


def train_metrics(tokens_per_s, step_ms, tflops, phases):
    return {"tokens_per_s": tokens_per_s, "step_ms": step_ms, "model_tflops": tflops,
            "phase_ms": phases}


OFFLOAD_LOG = ["model gpt2-1558m: 1557611200 parameters (n_layer 48, n_head 25, n_embd 1600)",
               "offload mode: AdamW on the CPU (avx512bf16) with fp32 state, DPU after 3 steps"]


def full_run():
    return {
        "bench_train_124m_bf16": {"bench": [{"name": "train", "matmul_gflops": 800000.0}]},
        "resident_124m_bf16": {"metrics": train_metrics(400000.0, 41.0, 440.0, {})},
        "pytorch_124m": {"bench": [{"name": "pytorch_gpt2", "tokens_per_s": 380000.0}]},
        "resident_1558m": {"metrics": train_metrics(20000.0, 410.0, 0, {
            "forward": 110.0, "backward": 290.0})},
        "offload_dpu_1558m": {"metrics": train_metrics(18500.0, 480.0, 0, {
            "forward": 190.0, "backward": 295.0, "d2h": 70.0, "adam": 450.0, "h2d": 66.0})},
        "cpu_adam_roofline": {"bench": [
            {"name": "triad", "threads": 16, "triad_gbytes_per_s": 110.0},
            {"name": "cpu_adam", "gbytes_per_s": 120.0},
            # bench_cpu_adam's records: q8 against fp32 state on the same ISA and threads only.
            {"name": "cpu_adam", "isa": "avx512bf16", "threads": 8, "master_dtype": "fp32",
             "state_dtype": "fp32", "gparams_per_s": 9.0},
            {"name": "cpu_adam", "isa": "avx512bf16", "threads": 16, "master_dtype": "bf16",
             "state_dtype": "fp32", "gparams_per_s": 5.0},
            {"name": "cpu_adam", "isa": "avx512bf16", "threads": 16, "master_dtype": "fp32",
             "state_dtype": "fp32", "gparams_per_s": 5.2},
            {"name": "cpu_adam", "isa": "avx512bf16", "threads": 16, "master_dtype": "fp32",
             "state_dtype": "q8", "gparams_per_s": 8.32}]},
    }


def rows_by_target(by_name, logs):
    return {r[0]: r for r in targets.target_rows(by_name, lambda s: logs.get(s, []))}


class TargetRows(unittest.TestCase):
    def test_every_ratio_against_its_peer(self):
        rows = rows_by_target(full_run(), {"offload_dpu_1558m": OFFLOAD_LOG})
        mfu = rows["124M bf16 B=16 T=1024 resident: MFU"]
        self.assertAlmostEqual(mfu[3], 440.0 / 800.0)
        self.assertEqual(mfu[5], "met")
        self.assertAlmostEqual(rows["same, against the datasheet peak (for reference)"][3],
                               440.0 / 989.4)
        self.assertEqual(rows["same, against the datasheet peak (for reference)"][5], "missed")
        torch = rows["124M resident: tokens/s vs PyTorch torch.compile"]
        self.assertAlmostEqual(torch[3], 400000.0 / 380000.0)
        self.assertEqual(torch[5], "met")
        practical = rows["1.5B offload + DPU: practicality"]
        self.assertAlmostEqual(practical[3], 18500.0 / 20000.0)
        self.assertEqual(practical[5], "met")
        # The slowest component is CPU Adam (450 ms), not the resident compute (400 ms).
        bound = rows["1.5B offload + DPU: step / max(component)"]
        self.assertAlmostEqual(bound[3], 480.0 / 450.0)
        self.assertIn("adam", bound[2])
        self.assertEqual(bound[4], "≤ 1.1")
        self.assertEqual(bound[5], "met")
        # 1,557,611,200 parameters x 28 B in 450 ms = 96.9 GB/s against a 110 GB/s triad.
        adam = rows["1.5B offload: CPU Adam in the step vs memory roofline"]
        self.assertAlmostEqual(adam[3], 1557611200 * 28 / 0.450 * 1e-9 / 110.0)
        self.assertEqual(adam[5], "met")
        q8 = rows["CPU Adam alone: q8 state vs fp32 state, same threads"]
        self.assertAlmostEqual(q8[3], 8.32 / 5.2)
        self.assertEqual(q8[5], "met")
        self.assertIn("16 threads", q8[1])

    def test_the_gpu_share_falls_back_to_the_offloaded_runs_own_compute(self):
        run = full_run()
        del run["resident_1558m"]
        rows = rows_by_target(run, {"offload_dpu_1558m": OFFLOAD_LOG})
        bound = rows["1.5B offload + DPU: step / max(component)"]
        self.assertAlmostEqual(bound[3], 480.0 / 485.0)  # forward 190 + backward 295
        self.assertIn("gpu (own)", bound[2])
        self.assertEqual(rows["1.5B offload + DPU: practicality"][5], "not run")

    def test_bf16_state_moves_fewer_bytes_and_a_slow_step_misses(self):
        run = full_run()
        run["offload_dpu_1558m"]["metrics"]["step_ms"] = 600.0
        log = [OFFLOAD_LOG[0], OFFLOAD_LOG[1].replace("fp32 state", "bf16 state")]
        rows = rows_by_target(run, {"offload_dpu_1558m": log})
        adam = rows["1.5B offload: CPU Adam in the step vs memory roofline"]
        self.assertAlmostEqual(adam[3], 1557611200 * 20 / 0.450 * 1e-9 / 110.0)
        self.assertEqual(adam[5], "missed")
        self.assertEqual(rows["1.5B offload + DPU: step / max(component)"][5], "missed")

    def test_llama_offload_and_graph_rows(self):
        run = full_run()
        run["offload_1558m"] = {"metrics": train_metrics(15000.0, 550.0, 0, {})}
        run["llama_1b_resident"] = {"metrics": dict(train_metrics(50000.0, 160.0, 0, {}),
                                                    losses=[11.77, 11.5])}
        run["pytorch_llama_1b"] = {"bench": [{"name": "pytorch_llama", "tokens_per_s": 40000.0,
                                              "first_loss": 11.76}]}
        run["llama_1b_offload_dpu"] = {"metrics": train_metrics(44000.0, 0, 0, {})}
        run["llama_1b_offload"] = {"metrics": train_metrics(38000.0, 0, 0, {})}
        run["llama_8b_offload_dpu"] = {"metrics": train_metrics(8000.0, 0, 300.0, {})}
        run["resident_124m_bf16_eager"] = {"metrics": train_metrics(360000.0, 0, 0, {})}
        run["offload_dpu_q8_1558m"] = {"metrics": train_metrics(19000.0, 0, 0, {})}
        run["offload_dpu_q8_bf16master_1558m"] = {"metrics": train_metrics(17000.0, 0, 0, {})}
        rows = rows_by_target(run, {})
        self.assertAlmostEqual(rows["1.5B offload + DPU, q8 state: practicality"][3], 0.95)
        self.assertEqual(rows["1.5B offload + DPU, q8 state: practicality"][5], "met")
        self.assertAlmostEqual(
            rows["1.5B offload + DPU, q8 state and bf16 master: practicality"][3], 0.85)
        self.assertAlmostEqual(rows["1.5B offload, exact update: practicality"][3], 0.75)
        self.assertEqual(rows["1.5B offload, exact update: practicality"][5], "missed")
        peer = rows["Llama 3.2 1B resident: tokens/s vs PyTorch (SDPA)"]
        self.assertAlmostEqual(peer[3], 1.25)
        self.assertIn("first loss 11.7700", peer[1])
        self.assertIn("first loss 11.7600", peer[2])
        self.assertAlmostEqual(rows["Llama 3.2 1B offload + DPU: practicality"][3], 0.88)
        self.assertEqual(rows["Llama 3.2 1B offload + DPU: practicality"][5], "missed")
        self.assertAlmostEqual(rows["Llama 3.2 1B offload, exact update: practicality"][3], 0.76)
        big = rows["Llama 3.1 8B offload + DPU, grad-accum 8: model TFLOP/s"]
        self.assertAlmostEqual(big[3], 300.0 / 272.0)
        self.assertEqual(big[5], "met")
        self.assertAlmostEqual(rows["124M resident: CUDA Graphs on vs off"][3], 400000.0 / 360000.0)

    def test_missing_inputs_say_not_run(self):
        rows = targets.target_rows({}, lambda s: [])
        self.assertEqual(len(rows), 18)
        for r in rows:
            self.assertIsNone(r[3], r[0])
            self.assertEqual(r[5], "not run", r[0])
        # Without the banner the parameter count is unknown: no Adam figure is made up.
        rows = rows_by_target(full_run(), {})
        self.assertEqual(rows["1.5B offload: CPU Adam in the step vs memory roofline"][5],
                         "not run")


class Report(unittest.TestCase):
    def test_summarize_writes_the_targets_from_a_log_directory(self):
        with tempfile.TemporaryDirectory() as d:
            results = os.path.join(d, "results.jsonl")
            steps = ["bench_train_124m_bf16", "resident_124m_bf16", "pytorch_124m",
                     "resident_1558m", "offload_dpu_1558m", "cpu_adam_roofline",
                     "sample_124m_bf16", "device_info"]
            with open(results, "w") as f:
                for s in steps:
                    f.write(json.dumps({"step": s, "rc": 0, "seconds": 1.0, "limit": 9}) + "\n")
            run = full_run()
            for s in ("bench_train_124m_bf16", "pytorch_124m", "cpu_adam_roofline"):
                with open(os.path.join(d, s + ".log"), "w") as f:
                    f.write("\n".join(json.dumps(b) for b in run[s]["bench"]) + "\n")
            with open(os.path.join(d, "offload_dpu_1558m.log"), "w") as f:
                f.write("\n".join(OFFLOAD_LOG) + "\n")
            with open(os.path.join(d, "device_info.log"), "w") as f:
                f.write("+-----+\n| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04 |\n")
            with open(os.path.join(d, "sample_124m_bf16.log"), "w") as f:
                f.write("1,2,3\nsample: prefill of 16 tokens in 9.0 ms; 511 decode steps in "
                        "1.000 s, 511.0 tokens/s (cuda:0 H100 (bf16))\n")
            # Five steps each, so that the means skip three warm-up steps: 2 steps of 480 ms.
            for s, ms, tok_step in (("resident_124m_bf16", 41.0, 16384),
                                    ("offload_dpu_1558m", 480.0, 8192),
                                    ("resident_1558m", 410.0, 8192)):
                m = run[s]["metrics"]
                with open(os.path.join(d, s + ".metrics"), "w") as f:
                    for i in range(5):
                        row = {"step": i + 1, "loss": 5.0, "tokens": tok_step * (i + 1),
                               "step_ms": ms, "tflops": m["model_tflops"]}
                        row.update({k + "_ms": v for k, v in m["phase_ms"].items()})
                        f.write(json.dumps(row) + "\n")
            report = os.path.join(d, "report.md")
            subprocess.run([sys.executable, os.path.join(GPU_BENCH, "summarize.py"), results,
                            report, os.path.join(d, "results.json"), d], check=True,
                           stdout=subprocess.DEVNULL)
            with open(report) as f:
                text = f.read()
        self.assertIn("## Targets", text)
        self.assertIn("| sample_124m_bf16 | 0 | 1.0 | prefill of 16 tokens in 9.0 ms; 511 decode "
                      "steps in 1.000 s, 511.0 tokens/s (cuda:0 H100 (bf16)) |", text)
        self.assertNotIn("Per-kernel", text)  # nvidia-smi's table is not a kernel profile
        # 41 ms per 16,384 tokens, at 440 of the GEMM's 800 TFLOP/s.
        self.assertIn("| 124M bf16 B=16 T=1024 resident: MFU | 440.0 TFLOP/s | cuBLASLt GEMM 800 "
                      "TFLOP/s | 0.550 | ≥ 0.5 | met |", text)
        practical = 8192 / 0.480 / (8192 / 0.410)
        self.assertIn(f"| 1.5B offload + DPU: practicality | 17067 tok/s | resident 19980 tok/s "
                      f"| {practical:.3f} | ≥ 0.9 | missed |", text)


NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
              '"Metric Value"')


def ncu_row(i, name, unit, value):
    return (f'"{i}","77","offload_train","h","{name}","1","13","(128, 1, 1)","(96, 12, 16)","0",'
            f'"9.0","Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


class KernelProfile(unittest.TestCase):
    def test_kernels_are_grouped_as_the_predicted_budget(self):
        import kernel_profile
        lines = ["step 3/4 | loss 10.9", "==PROF== Disconnected", NCU_HEADER,
                 ncu_row(0, "void zo::gpu::attention_tc_forward_kernel<__nv_bfloat16, 64>"
                            "(zo::gpu::AttentionShape)", "nsecond", "1,500,000"),
                 ncu_row(1, "attention_tc_dq_kernel", "usecond", "2000"),
                 ncu_row(2, "attention_tc_dkv_kernel", "msecond", "1.5"),
                 ncu_row(3, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
                         "nsecond", "3000000"),
                 ncu_row(4, "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTT", "nsecond", "1000000"),
                 ncu_row(5, "void zo::gpu::layernorm_forward_kernel<float, 4>()", "nsecond",
                         "250000"),
                 ncu_row(6, "void zo::gpu::adamw_kernel<__nv_bfloat16, __nv_bfloat16, 4>()",
                         "nsecond", "1400000"),
                 ncu_row(7, "void zo::gpu::sum_squares_partial_kernel<__nv_bfloat16, 8>()",
                         "nsecond", "50000"),
                 ncu_row(8, "void zo::gpu::elementwise_kernel<Add, __nv_bfloat16>()", "nsecond",
                         "300000")]
        times = kernel_profile.kernel_times(lines)
        self.assertEqual(len(times), 9)
        self.assertAlmostEqual(times[1][1], 2e6)  # usecond
        by, total = kernel_profile.summarize(times)
        self.assertAlmostEqual(total, 1.5 + 2.0 + 1.5 + 3.0 + 1.0 + 0.25 + 1.4 + 0.05 + 0.3)
        self.assertEqual(by["attention forward"], (1, 1.5))
        self.assertEqual(by["attention backward"][0], 2)
        self.assertAlmostEqual(by["attention backward"][1], 3.5)
        self.assertEqual(by[kernel_profile.GEMMS[0]], (2, 4.0))
        self.assertEqual(by["AdamW"], (1, 1.4))
        table = "\n".join(kernel_profile.table(by, total))
        self.assertIn("| attention (forward + backward) | | 5.00 | 45.5% | 8-14 |", table)
        # LayerNorm 0.25 + residual add 0.3, against the budget's 3.2 ms.
        self.assertIn("| LayerNorms, residual adds, cross-entropy, embedding | | 0.55 | 5.0% | 3.2 |",
                      table)
        self.assertIn("| **all kernels** | 9 | **11.00** | 100% |", table)

    def test_a_missing_header_or_unknown_unit_is_an_error(self):
        import kernel_profile
        with self.assertRaises(ValueError):
            kernel_profile.kernel_times(["no csv here"])
        with self.assertRaises(ValueError):
            kernel_profile.kernel_times([NCU_HEADER, ncu_row(0, "k", "cycle", "5")])


if __name__ == "__main__":
    unittest.main()
