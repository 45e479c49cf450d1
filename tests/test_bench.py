"""The benchmark tool's own logic, on the CPU: grids, the correctness gate, files and charts.

No timing thresholds: only what the tool decides and writes is checked.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from contextlib import contextmanager

import numpy as np
import pytest
from reference import attention_backward_ref, attention_ref  # tests/reference.py: the float64 truth every test uses
from waveboost.bench import cli, grid, hardware, impls, main, measure, report

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
TINY = ["--device", "cpu", "--seqlens", "16,33", "--heads", "4", "--kv-heads", "2", "--head-dims", "8",
        "--causal", "both", "--repeats", "3", "--budget-ms", "2", "--plain"]


def test_fa2_preset_is_the_anchors_grid():
    cases = grid.expand("fa2", "cuda")
    assert len(cases) == 6 * 2 * 2 * 2  # seqlens x head dims x causal x dtypes
    assert {c.seqlen for c in cases} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {c.dtype for c in cases} == {"float16", "bfloat16"}
    assert all(c.batch * c.seqlen == 16384 and c.heads * c.head_dim == 2048 for c in cases)
    assert all(c.kv_heads == c.heads for c in cases)
    split = grid.expand("fa2", "cuda", dtypes=grid.parse_dtypes("fp32"), seqlens=(1024, 4096))
    assert {(c.dtype, c.seqlen, c.batch) for c in split} == {("float32", 1024, 16), ("float32", 4096, 4)}


def test_seed_preset_is_the_original_configuration():
    (case,) = grid.expand("seed", "cuda")
    assert (case.batch, case.heads, case.seqlen, case.head_dim, case.dtype, case.causal) == (1, 1, 512, 64,
                                                                                             "float16", False)


def test_models_preset_rows_are_valid_gqa_mqa_shapes():
    rows = {c.label: c for c in grid.expand("models", "cuda")}
    assert set(rows) == {"llama3-70b", "llama3-405b", "mha", "mqa"}
    shapes = {k: (c.batch, c.seqlen, c.heads, c.kv_heads, c.head_dim) for k, c in rows.items()}
    assert shapes["llama3-70b"] == (1, 4096, 64, 8, 128)
    assert shapes["llama3-405b"] == (1, 2048, 128, 8, 128)
    assert shapes["mha"] == (2, 2048, 128, 128, 128)
    assert rows["mqa"].kv_heads == 1
    assert all(c.heads % c.kv_heads == 0 for c in rows.values())


def test_flops_formula_halves_for_causal():
    case = grid.Case(2, 512, 4, 4, 64, "float32", False)
    assert case.flops == 4 * 2 * 4 * 512 * 512 * 64
    assert grid.Case(2, 512, 4, 4, 64, "float32", True).flops == case.flops / 2


def test_bad_axes_are_rejected():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        grid.expand("quick", "cpu", heads=(6,), kv_heads=(4,))
    with pytest.raises(ValueError, match="--dtypes"):
        grid.parse_dtypes("float8")
    with pytest.raises(SystemExit):
        main(TINY + ["--impls", "no_such_impl"])


@pytest.mark.parametrize("causal", [False, True])
def test_float64_reference_matches_tests_reference(causal):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 37, 2, 16)) for _ in range(3))
    ref, _ = attention_ref(q, k, v, causal=causal)
    assert np.allclose(measure._attention_f64(q[0, :, 1], k[0, :, 1], v[0, :, 1], causal), ref[0, :, 1])


def _files(out):
    return {p.name for p in out.iterdir()}


def test_tiny_grid_through_the_cli_writes_csv_json_png(tmp_path):
    out = tmp_path / "run"
    status = main(TINY + ["--impls", "numpy,waveboost_cpu", "--out", str(out)])
    assert status == 0
    assert {"latency.csv", "throughput.csv", "memory.csv", "results.json", "summary.md"} <= _files(out)
    with open(out / "latency.csv") as f:
        rows = list(csv.DictReader(f))
    numpy_rows = [r for r in rows if r["impl"] == "numpy"]
    assert len(numpy_rows) == 4  # 2 seqlens x 2 causal
    assert all(r["status"] == "ok" and float(r["median_ms"]) > 0 and float(r["rel_err"]) < 1e-5
               for r in numpy_rows)
    result = json.loads((out / "results.json").read_text())
    assert result["environment"]["device"] == "cpu"
    assert result["command"].startswith("python -m waveboost.bench --device cpu")
    assert {"waveboost", "numpy", "torch", "jax"} <= set(result["environment"]["versions"])
    assert len(result["rows"]) == len(rows)
    if not HAS_MATPLOTLIB:
        pytest.skip("matplotlib not installed: charts are not written")
    pngs = {"latency.png", "throughput.png", "memory.png", "speedup.png", "dashboard.png"}
    assert pngs <= _files(out)
    assert all((out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pngs)


def _counting(prepare, calls):
    @contextmanager
    def counted(case, x):
        with prepare(case, x) as prep:
            run = prep.run

            def counted_run():
                calls.append(1)
                return run()
            prep.run = counted_run
            yield prep
    return counted


@contextmanager
def _wrong_scale(case, x):
    """softmax with twice the scale: a plausible-looking, wrong result."""
    with impls._numpy_prepare(case, measure.Inputs(x.q * 2, x.k, x.v)) as prep:
        yield prep


@contextmanager
def _refuses(case, x):
    raise ValueError("head_dim 8 is not supported (expected 64 or 128)")
    yield


def test_wrong_implementation_is_reported_and_not_timed(tmp_path, monkeypatch):
    calls = []
    fake = [
        impls.Impl("numpy", impls._numpy_prepare, lambda: None),
        impls.Impl("wrong_scale", _counting(_wrong_scale, calls), lambda: None),
        impls.Impl("refuses", _refuses, lambda: None),
        impls.Impl("absent", _refuses, lambda: "absentlib not installed"),
        impls.Impl("huge", impls._numpy_prepare, lambda: None, score_bytes=1e12),
    ]
    monkeypatch.setattr(impls, "registry", lambda device: fake)
    out = tmp_path / "run"
    assert main(TINY + ["--out", str(out), "--baseline", "numpy"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    by_impl = {}
    for r in rows:
        by_impl.setdefault(r["impl"], []).append(r)
    assert all(r["status"] == "WRONG" and r["rel_err"] > 1e-2 and r.get("median_ms") is None
               for r in by_impl["wrong_scale"])
    assert len(calls) == len(by_impl["wrong_scale"])  # one checking call per cell, none timed
    assert all(r["status"] == "unsupported" and "head_dim 8" in r["reason"] for r in by_impl["refuses"])
    assert all(r["status"] == "skipped" and r["reason"].startswith("memory") for r in by_impl["huge"])
    assert "absent" not in by_impl
    assert all(r["status"] == "ok" and r["speedup"] == 1.0 for r in by_impl["numpy"])
    summary = (out / "summary.md").read_text()
    assert "absentlib not installed" in summary
    if HAS_MATPLOTLIB:
        assert "dashboard.png" in _files(out)


def test_waveboost_wrong_result_fails_the_run(tmp_path, monkeypatch):
    fake = [impls.Impl("waveboost_cpu", _wrong_scale, lambda: None, "waveboost")]
    monkeypatch.setattr(impls, "registry", lambda device: fake)
    assert main(TINY + ["--out", str(tmp_path), "--no-charts"]) == 1


def test_gqa_causal_numpy_peer_passes_the_check():
    case = grid.Case(2, 29, 6, 2, 16, "float32", True)
    inputs = measure.make_inputs(case, "cpu", seed=3)
    settings = measure.Settings(device="cpu", repeats=3, budget_s=0.001, mem_limit_bytes=1e9)
    impl = impls.Impl("numpy", impls._numpy_prepare, lambda: None)
    row = measure.run_cell(case, impl, inputs, measure.Reference(case, inputs), settings)
    assert row["status"] == "ok" and row["rel_err"] < 1e-5
    assert row["reps"] >= measure.MIN_REPS and row["q1_ms"] <= row["median_ms"] <= row["q3_ms"]
    assert row["mem_extra_bytes"] >= 2 * 29 * 6 * 16 * 4  # at least the output


def test_checked_heads_cover_every_kv_group_boundary():
    batches, heads = measure._checked_heads(grid.Case(4, 16, 64, 8, 64, "float16", False))
    assert batches == [0, 3] and heads == [0, 9, 63]
    assert {h // 8 for h in heads} == {0, 1, 7}


def test_plain_table_without_rich(capsys):
    row = {**grid.Case(1, 16, 2, 2, 8, "float32", False).fields(), "impl": "numpy", "status": "WRONG",
           "reason": "rel err 1.00e+00 > 1.0e-04", "rel_err": 1.0, "clock": "host"}
    report.add_speedups([row], "numpy")
    report.print_table([row], [{"name": "torch_sdpa", "missing": "torch not installed"}], "cpu", "numpy")
    text = capsys.readouterr().out
    assert "WRONG: rel err" in text and "not installed: torch not installed" in text


def test_torch_peer_and_torch_reference_on_cpu():
    torch = pytest.importorskip("torch")
    case = grid.Case(2, 24, 4, 2, 16, "float32", True)
    inputs = measure.make_inputs(case, "cpu", seed=5)
    settings = measure.Settings(device="cpu", repeats=3, budget_s=0.001, mem_limit_bytes=1e9)
    (sdpa,) = [i for i in impls.registry("cpu") if i.name == "torch_sdpa"]
    row = measure.run_cell(case, sdpa, inputs, measure.Reference(case, inputs), settings)
    assert row["status"] == "ok" and row["rel_err"] < 1e-5  # GQA through enable_gqa, causal
    # The torch branch of the reference (used for CUDA cells) agrees with the NumPy one.
    as_torch = measure.Inputs(*(torch.from_numpy(t) for t in (inputs.q, inputs.k, inputs.v)))
    out = measure.Reference(case, inputs).outputs
    assert all(np.allclose(a, b.numpy()) for a, b in zip(out, measure.Reference(case, as_torch).outputs))


# ---- honest reporting: header, baseline, spread, interrupted runs, progress -----------------

BARE = [a for a in TINY if a != "--plain"]  # rich (when installed) must still fall back to plain lines off a TTY


def test_help_cites_no_file_outside_the_repository(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "ANCHORS" not in text and ".md" not in text


def test_header_names_cpu_path_threads_and_baseline(tmp_path, capsys):
    import waveboost

    out = tmp_path / "run"
    assert main(TINY + ["--impls", "numpy,waveboost_cpu", "--out", str(out), "--no-charts"]) == 0
    text = capsys.readouterr().out
    info = waveboost.info()
    assert info["cpu_isa"] in ("avx512", "avx2", "baseline") and info["cpu_threads"] >= 1
    assert f"CPU path {info['cpu_isa']} with {info['cpu_threads']} threads" in text
    assert "speedup = numpy time / implementation time" in text
    summary = (out / "summary.md").read_text()
    assert f"CPU path {info['cpu_isa']}" in summary and "geomean speedup vs numpy" in summary


def test_default_baseline_does_not_depend_on_what_is_installed(tmp_path):
    pytest.importorskip("torch", reason="the point is that torch being installed changes nothing")
    out = tmp_path / "run"
    assert main(TINY + ["--impls", "torch_sdpa,numpy,waveboost_cpu", "--out", str(out), "--no-charts"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["settings"]["baseline"] == "numpy"
    assert all(r["baseline"] == "numpy" for r in result["rows"])


def test_without_the_baseline_no_speedups_are_made_up(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(TINY + ["--impls", "waveboost_cpu", "--out", str(out)]) == 0
    assert "no speedups: the baseline did not run" in capsys.readouterr().out
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert rows and all(r["speedup"] is None for r in rows)
    if HAS_MATPLOTLIB:
        assert "speedup.png" not in _files(out) and "dashboard.png" in _files(out)


def test_baseline_that_cannot_run_is_an_error(monkeypatch):
    fake = [impls.Impl("numpy", impls._numpy_prepare, lambda: None),
            impls.Impl("absent", _refuses, lambda: "absentlib not installed")]
    monkeypatch.setattr(impls, "registry", lambda device: fake)
    with pytest.raises(SystemExit):
        main(TINY + ["--baseline", "absent"])


@contextmanager
def _jittery(case, x):
    """Every other call takes 3 ms longer: timings that disagree, whatever the machine."""
    import time

    with impls._numpy_prepare(case, x) as prep:
        run, calls = prep.run, [0]

        def jittery_run():
            calls[0] += 1
            if calls[0] % 2:
                time.sleep(0.003)
            return run()
        prep.run = jittery_run
        yield prep


def test_disagreeing_timings_are_retimed_and_marked(tmp_path, monkeypatch, capsys):
    fake = [impls.Impl("numpy", impls._numpy_prepare, lambda: None),
            impls.Impl("jittery", _jittery, lambda: None)]
    monkeypatch.setattr(impls, "registry", lambda device: fake)
    out = tmp_path / "run"
    assert main(TINY + ["--repeats", "8", "--budget-ms", "50", "--out", str(out), "--no-charts"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    jittery = [r for r in rows if r["impl"] == "jittery"]
    assert jittery and all(r["retimed"] and r["unstable"] and r["spread"] > 0.10 for r in jittery)
    assert all(r["speedup_unstable"] for r in jittery)
    text = capsys.readouterr().out
    assert "timings stayed unstable after a re-run" in text
    assert any(line.split()[-1] == "~" for line in text.splitlines() if "jittery" in line)
    with open(out / "latency.csv") as f:
        assert all(r["unstable"] == "1" for r in csv.DictReader(f) if r["impl"] == "jittery")


@contextmanager
def _interrupts_on_second_cell(case, x, seen=[]):
    seen.append(case)
    if len(seen) == 2:
        raise KeyboardInterrupt
    with impls._numpy_prepare(case, x) as prep:
        yield prep


def test_interrupted_run_keeps_the_cells_it_measured(tmp_path, monkeypatch):
    fake = [impls.Impl("numpy", _interrupts_on_second_cell, lambda: None)]
    monkeypatch.setattr(impls, "registry", lambda device: fake)
    out = tmp_path / "run"
    assert main(TINY + ["--out", str(out), "--no-charts"]) == 130
    result = json.loads((out / "results.json").read_text())
    assert result["interrupted"] is True and result["cells_done"] == 1
    assert len(result["rows"]) == 1 and result["rows"][0]["status"] == "ok"
    assert "INTERRUPTED: 1 of 4 cells measured" in (out / "summary.md").read_text()


def test_progress_is_plain_lines_off_a_terminal(tmp_path, capsys):
    assert main(BARE + ["--impls", "numpy", "--out", str(tmp_path / "run"), "--no-charts"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert len([line for line in lines if "] done: " in line]) == 4  # one per cell and implementation
    assert lines[-1].startswith("[4/4 ")


def test_steady_flags_are_real_false_in_json(tmp_path):
    out = tmp_path / "run"
    assert main(TINY + ["--impls", "numpy", "--out", str(out), "--no-charts", "--spread-threshold", "1000"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert all(r["unstable"] is False and "retimed" not in r for r in rows)


def test_header_states_the_work_of_the_grid(tmp_path, capsys):
    assert main(TINY + ["--impls", "numpy", "--out", str(tmp_path / "run"), "--no-charts"]) == 0
    cases = grid.expand("quick", "cpu", seqlens=(16, 33), heads=(4,), kv_heads=(2,), head_dims=(8,),
                        causal=(False, True))
    gflop = sum(c.flops for c in cases) / 1e9
    assert f"grid: 4 cells, {gflop:.4g} GFLOP per implementation (preset quick)" in capsys.readouterr().out


def test_cpu_grid_too_long_for_the_limit_is_refused_with_an_estimate(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--preset", "models", "--impls", "waveboost_cpu", "--max-minutes", "0.01"])
    err = capsys.readouterr().err
    assert "this grid would take at least ~" in err and "GFLOP/s on this machine" in err and "--max-minutes" in err


def test_estimate_grows_with_the_grid():
    settings = measure.Settings(device="cpu", repeats=20, budget_s=0.2, mem_limit_bytes=1e9)
    small, rate = cli.estimate_cpu_minutes(grid.expand("quick", "cpu"), 1, settings)
    large, _ = cli.estimate_cpu_minutes(grid.expand("models", "cpu"), 2, settings)
    assert rate > 0 and 0 < small < large


# ---- passes: backward alone and forward + backward --------------------------------------------

PEERS = "numpy,waveboost_cpu,torch_sdpa,jax_xla"


def test_pass_flops_are_2_5x_and_3_5x_the_forward():
    fwd = grid.Case(2, 512, 4, 4, 64, "float32", True)
    assert fwd.flops == 4 * 2 * 4 * 512 * 512 * 64 / 2
    assert grid.Case(2, 512, 4, 4, 64, "float32", True, pass_name="bwd").flops == 2.5 * fwd.flops
    assert grid.Case(2, 512, 4, 4, 64, "float32", True, pass_name="fwdbwd").flops == 3.5 * fwd.flops
    with pytest.raises(ValueError, match="pass must be one of"):
        grid.Case(2, 512, 4, 4, 64, "float32", True, pass_name="backward")


def test_train_preset_is_causal_fwdbwd_at_model_shapes():
    gpu = grid.expand("train", "cuda")
    assert {c.pass_name for c in gpu} == {"fwdbwd"} and all(c.causal for c in gpu)
    assert {c.dtype for c in gpu} == {"float16", "bfloat16"}
    assert any(c.kv_heads < c.heads for c in gpu) and {c.head_dim for c in gpu} == {64, 128}
    cpu = grid.expand("train", "cpu")
    assert {c.dtype for c in cpu} == {"float32"} and all(c.flops < 1e9 for c in cpu)
    both = grid.expand("train", "cpu", passes=grid.parse_passes("fwd,bwd"))
    assert {c.pass_name for c in both} == {"fwd", "bwd"} and len(both) == 2 * len(cpu)
    with pytest.raises(ValueError, match="--pass"):
        grid.parse_passes("fwd,backward")


@pytest.mark.parametrize("causal", [False, True])
def test_float64_gradients_match_tests_reference(causal):
    rng = np.random.default_rng(2)
    q, dout = (rng.standard_normal((1, 19, 4, 16)) for _ in range(2))
    k, v = (rng.standard_normal((1, 23, 2, 16)) for _ in range(2))  # Lq != Lk, GQA 2
    dq, dk, dv = attention_backward_ref(dout, q, k, v, causal=causal)
    got = [measure._attention_grads_f64(q[0, :, h], k[0, :, h // 2], v[0, :, h // 2], dout[0, :, h], causal)
           for h in range(4)]
    assert all(np.allclose(g[1], dq[0, :, h]) for h, g in enumerate(got))
    assert np.allclose(got[0][2] + got[1][2], dk[0, :, 0]) and np.allclose(got[2][3] + got[3][3], dv[0, :, 1])
    ref, _ = attention_ref(q, k, v, causal=causal)
    assert all(np.allclose(g[0], ref[0, :, h]) for h, g in enumerate(got))
    torch = pytest.importorskip("torch")  # the branch CUDA cells use
    as_torch = measure._attention_grads_f64(*(torch.from_numpy(t[0, :, 0]) for t in (q, k, v, dout)), causal)
    assert all(np.allclose(a.numpy(), b) for a, b in zip(as_torch, got[0]))


def test_backward_passes_through_the_cli_with_peers(tmp_path, capsys):
    out = tmp_path / "run"
    one_length = [{"16,33": "33", "both": "1"}.get(a, a) for a in TINY]  # two cells: bwd and fwdbwd
    assert main(one_length + ["--pass", "bwd,fwdbwd", "--impls", PEERS, "--out", str(out), "--no-charts"]) == 0
    text = capsys.readouterr().out
    assert "backward 2.5x that, fwdbwd 3.5x" in text
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["pass_name"] for r in rows} == {"bwd", "fwdbwd"}
    ran = {r["impl"] for r in rows}
    assert {"numpy", "waveboost_cpu"} <= ran
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in rows), [(r["impl"], r["reason"]) for r in rows]
    cases = grid.expand("quick", "cpu", seqlens=(33,), heads=(4,), kv_heads=(2,), head_dims=(8,),
                        causal=(True,), passes=("bwd",))
    assert sorted(r["tflops"] * r["median_ms"] * 1e9 for r in rows if r["impl"] == "numpy" and
                  r["pass_name"] == "bwd") == pytest.approx(sorted(c.flops for c in cases))
    with open(out / "latency.csv") as f:
        assert {r["pass_name"] for r in csv.DictReader(f)} == {"bwd", "fwdbwd"}


@contextmanager
def _gqa_grads_of_one_head(case, x):
    """dk and dv of a kv head taken from the first of its query heads only: the GQA reduction missing."""
    with impls._numpy_prepare(case, x) as prep:
        run = prep.run

        def wrong():
            dq, dk, dv = run()
            b, lq, h, d = x.q.shape
            g = h // case.kv_heads
            one = measure.Inputs(x.q[:, :, ::g], x.k, x.v, x.dout[:, :, ::g])
            with impls._numpy_prepare(grid.Case(b, lq, h // g, case.kv_heads, d, case.dtype, case.causal,
                                                pass_name="bwd"), one) as single:
                _, dk1, dv1 = single.run()
            return dq, dk1, dv1
        prep.run = wrong
        yield prep


@contextmanager
def _wrong_scale_grads(case, x):
    with impls._numpy_prepare(case, measure.Inputs(x.q * 2, x.k, x.v, x.dout)) as prep:
        yield prep


def test_wrong_gradients_are_reported(tmp_path, monkeypatch):
    fake = [impls.Impl("numpy", impls._numpy_prepare, lambda: None, applies=impls._any_pass),
            impls.Impl("no_gqa_sum", _gqa_grads_of_one_head, lambda: None, applies=impls._any_pass),
            impls.Impl("wrong_scale", _wrong_scale_grads, lambda: None, applies=impls._any_pass)]
    monkeypatch.setattr(impls, "registry", lambda device: fake)
    out = tmp_path / "run"
    assert main(TINY + ["--pass", "bwd", "--out", str(out), "--no-charts"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    by = {(r["impl"], r["seqlen"], r["causal"]): r for r in rows}
    assert all(r["status"] == "ok" for k, r in by.items() if k[0] == "numpy")
    assert all(r["status"] == "WRONG" and r["rel_err"] > 0.1 and r.get("median_ms") is None
               for k, r in by.items() if k[0] != "numpy")


def test_forward_only_implementations_sit_out_the_backward(monkeypatch):
    fake = [impls.Impl("numpy", impls._numpy_prepare, lambda: None, applies=impls._any_pass),
            impls.Impl("forward_only", impls._numpy_prepare, lambda: None)]
    cases = grid.expand("quick", "cpu", passes=("bwd",))
    assert [i.name for i in cli.applicable(fake, cases)] == ["numpy"]
    cuda = {i.name: i for i in impls.registry("cuda")}
    bwd = grid.Case(1, 1024, 16, 16, 128, "bfloat16", True, pass_name="bwd")
    decode = grid.Case(8, 4096, 32, 8, 128, "bfloat16", False, layout="kvcache", seqlen_q=1)
    for name in ("waveboost_naive", "waveboost_auto", "waveboost_auto_det", "sdpa_flash", "sdpa_cudnn", "sdpa_eff",
                 "jax_cudnn", "fa3"):
        assert cuda[name].applies(bwd), name
    assert not cuda["waveboost_simt"].applies(bwd) and not cuda["waveboost_wmma"].applies(bwd)
    assert not cuda["waveboost_naive"].applies(decode) and impls._backend_applies("decode", set())(decode)
    assert not impls._backend_applies("decode", set())(bwd) and impls._backend_applies("mma", {"mma"})(bwd)
    assert not cuda["fa3"].applies(decode) and cuda["fa3_kvcache"].applies(decode)
    assert cuda["waveboost_auto"].applies(decode) and cuda["sdpa_cudnn"].applies(decode)
    if impls.module("flash_attn3_jax") is None:  # not installed: a reason, not a crash
        assert cuda["fa3"].missing() and cuda["fa3_kvcache"].missing()


# ---- serving presets: decode, paged, varlen ---------------------------------------------------

def test_serving_cells_count_bytes_and_bottom_right_flops():
    case = grid.Case(4, 512, 8, 2, 64, "bfloat16", False, layout="kvcache", seqlen_q=1)
    assert case.bytes_moved == 2 * 4 * 512 * 2 * 64 * 2 + 2 * 4 * 1 * 8 * 64 * 2
    assert case.flops == 4 * 4 * 8 * 1 * 512 * 64
    verify = grid.Case(1, 16, 2, 2, 8, "float32", True, layout="kvcache", seqlen_q=4)
    assert verify.flops == 4 * 2 * 8 * (13 + 14 + 15 + 16)  # query i sees i + 13 keys
    varlen = grid.Case(5, 100, 2, 2, 8, "float32", False, layout="varlen", seqlen_q=1)
    assert varlen.kv_lengths == (50, 75, 100, 125, 150) and sum(varlen.kv_lengths) == 5 * 100
    with pytest.raises(ValueError, match="forward-only"):
        grid.Case(1, 64, 2, 2, 8, "float32", False, layout="paged", page_size=16, seqlen_q=1, pass_name="bwd")
    with pytest.raises(ValueError, match="multiple of page_size"):
        grid.Case(1, 60, 2, 2, 8, "float32", False, layout="paged", page_size=16, seqlen_q=1)


@pytest.mark.parametrize("preset", grid.SERVING_PRESETS)
def test_serving_presets_run_on_the_cpu_beside_peers(preset, tmp_path, capsys):
    out = tmp_path / preset
    peers = PEERS if preset != "paged" else "numpy,waveboost_cpu,torch_sdpa"  # JAX's dense cache: as in decode
    assert main(["--device", "cpu", "--preset", preset, "--impls", peers, "--repeats", "3", "--budget-ms", "2",
                 "--plain", "--no-charts", "--peak-gbs", "50", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GB/s = (K/V cache bytes read + q read + out written) / time" in text and "(--peak-gbs)" in text
    result = json.loads((out / "results.json").read_text())
    assert result["settings"]["peak_gbs"] == 50
    rows = result["rows"]
    layouts = {r["layout"] for r in rows}
    assert layouts == {"decode": {"kvcache"}, "paged": {"kvcache", "paged"}, "varlen": {"varlen"}}[preset]
    ours = [r for r in rows if r["impl"] == "waveboost_cpu"]
    assert ours and all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in ours)
    for r in rows:
        if r["status"] == "ok":
            case = grid.Case(**{k: r[k] for k in report.CASE_COLUMNS})
            assert r["gb_s"] == pytest.approx(case.bytes_moved / (r["median_ms"] * 1e-3) / 1e9)
            assert r["pct_peak"] == pytest.approx(100 * r["gb_s"] / 50)
        else:  # a peer that cannot express the cell says why
            assert r["impl"] != "waveboost_cpu" and r["status"] == "unsupported" and r["reason"]
    # waveboost and NumPy run every cell; the framework peers where they are installed.
    cells = {report.cell_key(r) for r in rows}
    for impl in ("waveboost_cpu", "numpy"):
        assert sum(r["impl"] == impl and r["status"] == "ok" for r in rows) == len(cells), impl
    summary = (out / "summary.md").read_text()
    assert "GB/s (% of peak)" in summary


def test_serving_preset_refuses_the_backward(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--preset", "decode", "--pass", "bwd"])
    assert "forward-only" in capsys.readouterr().err


@pytest.mark.parametrize("name, gbs", [("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H200", 4800),
                                       ("NVIDIA H100 PCIe", 2000), ("NVIDIA GH200 480GB", 4000),
                                       ("NVIDIA A100-SXM4-80GB", 2039)])
def test_peak_bandwidth_table(name, gbs):
    peak, source = hardware.peak_bandwidth("cuda", name)
    assert peak == gbs and source.startswith("table: ")
    assert hardware.peak_bandwidth("cuda", name, override=1234.0) == (1234.0, "--peak-gbs")
    assert hardware.peak_bandwidth("cpu", "AMD EPYC")[0] is None


def test_standalone_scripts_are_thin_wrappers_of_the_suite(tmp_path):
    import os
    import runpy

    here = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    backward = runpy.run_path(os.path.join(here, "backward_bench.py"), run_name="wrapper")
    args = cli.build_parser().parse_args(backward["DEFAULTS"])
    cases = grid.expand(args.preset, "cuda", seqlens=grid.parse_ints(args.seqlens),
                        dtypes=grid.parse_dtypes(args.dtypes), passes=grid.parse_passes(args.passes))
    assert {c.pass_name for c in cases} == {"bwd", "fwdbwd"} and {c.seqlen for c in cases} == {1024, 4096}
    chosen = {i.name for i in cli.applicable(cli.select(impls.registry("cuda"), args.impls), cases)}
    assert {"waveboost_auto", "waveboost_auto_det", "sdpa_flash", "fa3"} <= chosen and "waveboost_simt" not in chosen
    decode = runpy.run_path(os.path.join(here, "decode_bench.py"), run_name="wrapper")
    out = tmp_path / "decode"
    assert decode["run"](["--device", "cpu", "--impls", "numpy,waveboost_cpu", "--repeats", "3", "--budget-ms", "2",
                          "--plain", "--no-charts", "--out", str(out)]) == 0
    for preset in grid.SERVING_PRESETS:
        result = json.loads((out / preset / "results.json").read_text())
        assert result["settings"]["preset"] == preset and result["settings"]["cuda_graphs"] is True
        assert all(r["status"] == "ok" for r in result["rows"])


def test_probe_table_pairs_trees_sets_and_the_peer():
    import os
    import runpy

    here = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    table = runpy.run_path(os.path.join(here, "probe_table.py"), run_name="wrapper")["table"]
    lines = [{"shape": [1, 2048, 32, 8], "tag": f"{tree}-{r}-d128", "wb_blhd": us, "wb_blhd_pct": 20.0, "splits": 8}
             for tree, r, us in (("main", 1, 10.0), ("main", 2, 12.0), ("new", 1, 8.0), ("new", 2, 9.0),
                                 ("main", 3, 11.0))]
    lines += [{"shape": [1, 2048, 32, 8], "tag": "cudnn-d128", "sdpa_cudnn": 8.5, "sdpa_cudnn_pct": 19.0},
              {"shape": [4, 2048, 32, 8], "tag": "main-1-p16", "wb_blhd": 5.0, "wb_blhd_pct": 1.0}]  # no "new" run
    rows = table(lines, "main", "new").splitlines()
    assert len(rows) == 3 and rows[0].startswith("| set | shape | main us | new us")
    # medians: main 11.0, new 8.5; the peer 8.5
    assert rows[2] == "| d128 | 1x2048x32x8 | 11.00 | 8.50 (20.0, 8) | 1.294 | 8.50 (19.0) | 1.000 |"


def test_probe_table_kernels_and_merge_tables():
    import os
    import runpy

    here = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    mod = runpy.run_path(os.path.join(here, "probe_table.py"), run_name="wrapper")
    kern = {"void waveboost::cuda::decode_tma_kernel<A>": 8.0,
            "void waveboost::cuda::core::combine_many_kernel<B>": 4.0}
    lines = [{"shape": [1, 32768, 32, 1], "tag": f"{tree}-{r}-d128", "wb_blhd": 15.0,
              "wb_blhd_kernels": {k: v * f for k, v in kern.items()}}
             for tree, r, f in (("a", 1, 1.0), ("a", 2, 1.2), ("a", 3, 1.1), ("b", 1, 0.5), ("b", 2, 0.5))]
    lines.append({"shape": [8, 2048, 32, 8], "tag": "a-1-d128", "wb_blhd": 9.0,  # no combine on either side
                  "wb_blhd_kernels": {"void waveboost::cuda::decode_tma_kernel<A>": 7.0}})
    lines.append({"shape": [8, 2048, 32, 8], "tag": "b-1-d128", "wb_blhd": 9.0,
                  "wb_blhd_kernels": {"void waveboost::cuda::decode_tma_kernel<A>": 6.0}})
    rows = mod["kernel_table"](lines, "a", "b").splitlines()
    assert rows[0] == "| set | shape | decode kernel a / b us | combine a / b us |"
    assert rows[2] == "| d128 | 1x32768x32x1 | 8.80 / 4.00 | 4.40 / 2.00 |"  # medians: 1.1 x and 0.5 x
    assert rows[3] == "| d128 | 8x2048x32x8 | 7.00 / 6.00 | - |"
    merge = [{"shape": [2, 1, 16, 4, 128], "parts_dtype": "float32", "tag": f"{t}-{r}", "waveboost": us,
              "waveboost_pct": pct} for t, r, us, pct in (("a", 1, 10.0, 20.0), ("a", 2, 14.0, 18.0),
                                                          ("b", 1, 4.0, 60.0), ("b", 2, 6.0, 50.0))]
    merge.append({"shape": [2, 1, 16, 4, 128], "parts_dtype": "float32", "tag": "torch", "torch": 30.0})
    rows = mod["merge_table"](merge, "a", "b").splitlines()
    assert len(rows) == 3 and rows[2] == "| 2x1x16x4x128 | float32 | 12.00 (18.0) | 5.00 (50.0) | 2.400 |"


def test_merge_probe_torch_merge_matches_merge_attention_states():
    torch = pytest.importorskip("torch")
    import os
    import runpy
    import sys

    import waveboost

    here = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    sys.path.insert(0, here)  # merge_probe.py imports its neighbour decode_bench.py
    try:
        torch_merge = runpy.run_path(os.path.join(here, "merge_probe.py"), run_name="wrapper")["torch_merge"]
    finally:
        sys.path.remove(here)
    g = torch.Generator().manual_seed(3)
    outs = torch.randn(5, 2, 7, 3, 16, generator=g)
    lses = 3 * torch.randn(5, 2, 3, 7, generator=g)
    lses[1] = float("-inf")  # a part that saw no key
    out = torch.empty(2, 7, 3, 16, dtype=torch.bfloat16)
    torch_merge(outs, lses, out)
    ref, _ = waveboost.merge_attention_states(outs, lses)
    assert (out.float() - ref).abs().max().item() <= 2 ** -7 * ref.abs().max().item()


class _FakeFA3:
    """flash_attn3_jax's kv-cache entry point, written with jax.nn.dot_product_attention, to run the
    FlashAttention-3 kv-cache adapter's plumbing (splits, paged caches, jitted decode loops) on the CPU."""

    def __init__(self):
        self.splits_seen = set()

    def flash_mha_with_kvcache(self, q, k_cache, v_cache, cache_seqlens=None, page_table=None, is_causal=False,
                               num_splits=1):
        import jax
        self.splits_seen.add(num_splits)
        if page_table is not None:
            b, pages = page_table.shape
            k_cache, v_cache = (c[page_table].reshape(b, pages * c.shape[1], *c.shape[2:]) for c in (k_cache, v_cache))
        lk, lq = k_cache.shape[1], q.shape[1]
        window = {"local_window_size": (lk, lk - lq)} if is_causal and lq > 1 else {}
        return jax.nn.dot_product_attention(q, k_cache, v_cache, key_value_seq_lengths=cache_seqlens, **window)


@pytest.mark.parametrize("case", [
    grid.Case(2, 64, 4, 2, 16, "float32", True, layout="paged", seqlen_q=3, page_size=16),
    grid.Case(3, 48, 4, 1, 16, "float32", False, layout="varlen", seqlen_q=1),
], ids=lambda c: c.title())
def test_flash_attention_3_kvcache_adapter_with_a_stand_in(case, monkeypatch):
    pytest.importorskip("jax")
    fake = _FakeFA3()
    real = impls.module
    monkeypatch.setattr(impls, "module", lambda name: fake if name == "flash_attn3_jax" else real(name))
    monkeypatch.setattr(impls, "_fa3_check", lambda case: None)
    monkeypatch.setattr(impls, "_jax_to_bshd", lambda on_cpu: np.asarray)
    monkeypatch.setattr(impls, "DECODE_LOOP_STEPS", 2)  # one cache, two steps per program: a short compile
    monkeypatch.setattr(impls, "L2_BYTES", 1)
    (impl,) = [i for i in impls.registry("cuda") if i.name == "fa3_kvcache"]
    inputs = measure.make_inputs(case, "cpu", seed=7)
    settings = measure.Settings(device="cpu", repeats=3, budget_s=0.001, mem_limit_bytes=1e9)
    # The stand-in's XLA attention on the host in full fp32 precision (on a GPU, XLA's default
    # fp32 matmuls use TF32, too coarse for the 1e-5 check of the plumbing).
    import jax
    with jax.default_device(jax.devices("cpu")[0]), jax.default_matmul_precision("highest"):
        row = measure.run_cell(case, impl, inputs, measure.Reference(case, inputs), settings)
    assert row["status"] == "ok" and row["rel_err"] < 1e-5, row
    assert fake.splits_seen == {1, 8, 32} and "num_splits=" in row["reason"]
