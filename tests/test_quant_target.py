"""Deployment targets (vlsens.quantize.target): what CPU features decide, which settings each target
gets, and that with the run's saturation guard ONNX Runtime's integer kernels compute what the
engine estimates (per op and per set), while without it, on a CPU whose U8S8 kernels saturate,
they do not. The profile's repair and latency candidates as algorithms."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import default_config

from vlsens.core.errors import ConfigError
from vlsens.quantize.qdq import QuantSettings
from vlsens.quantize.target import check_profile_objective, cpu_features, resolve

EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n"
SAPPHIRE = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: sse2 avx2 avx512f avx512bw avx512_vnni amx_int8\n"
ALDER = "model name\t: 12th Gen Intel(R) Core(TM) i7\nflags\t\t: sse2 avx2 avx_vnni\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp i8mm\nCPU implementer\t: 0x41\n"


def test_cpu_features_tell_which_integer_kernels_saturate():
    epyc = cpu_features(EPYC)
    assert epyc["u8s8_saturates"] and not epyc["vnni"] and "avx2" in epyc["flags"] and epyc["model"] == "AMD EPYC 7B13"
    for text in (SAPPHIRE, ALDER):
        f = cpu_features(text)
        assert f["vnni"] and not f["u8s8_saturates"], f
    arm = cpu_features(GRAVITON)
    if arm["arch"] in ("x86_64", "i686", "i386"):  # this machine is x86: the text has no x86 flags
        assert "asimddp" in arm["flags"]
    assert not arm["vnni"]


def _cfg(**quant):
    cfg = default_config()
    cfg["quant"].update(quant)
    return cfg


def test_each_target_gets_its_settings():
    epyc, sapphire = cpu_features(EPYC), cpu_features(SAPPHIRE)
    auto = resolve(_cfg(), epyc)
    assert auto["guard"] == "reduce_range" and auto["reduce_range"] and "VNNI" in auto["guard_why"]
    assert auto["weight_type"] == "int8" and auto["activation_type"] == "uint8"
    assert resolve(_cfg(), sapphire)["guard"] == "none" and not resolve(_cfg(), sapphire)["reduce_range"]
    u8u8 = resolve(_cfg(saturation="u8u8"), epyc)
    assert u8u8["weight_type"] == "uint8" and not u8u8["reduce_range"]
    assert resolve(_cfg(saturation="none"), epyc)["guard"] == "none"
    trt = resolve(_cfg(target="tensorrt"), epyc)
    assert trt["activation_type"] == "int8" and trt["activation_symmetric"] and trt["guard"] == "none"
    s = QuantSettings.from_config(trt)
    assert s.kwargs()["extra_options"] == {"ActivationSymmetric": True} and s.target == "tensorrt"
    assert QuantSettings.from_config(auto).kwargs()["reduce_range"] is True
    for target in ("ort-cuda", "npu"):
        r = resolve(_cfg(target=target), epyc)
        assert r["guard"] == "none" and not r["reduce_range"] and r["weight_type"] == "int8"


def test_bad_target_settings_are_refused_with_the_key():
    epyc = cpu_features(EPYC)
    with pytest.raises(ConfigError, match=r"quant.saturation: reduce_range .* 'ort-cuda'"):
        resolve(_cfg(target="ort-cuda", saturation="reduce_range"), epyc)
    with pytest.raises(ConfigError, match=r"profile.objective: latency .*'npu'"):
        check_profile_objective("latency", resolve(_cfg(target="npu"), epyc), "profile.objective")
    check_profile_objective("latency", resolve(_cfg(), epyc), "profile.objective")  # ort-cpu: timed here


def test_latency_objective_for_an_untimed_target_fails_the_dag_build(tmp_path):
    import subprocess
    import sys

    import yaml
    from conftest import REPO

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["quant"]["target"] = "tensorrt"
    cfg["profile"]["objective"] = "latency"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--snakefile", str(REPO / "Snakefile"), "-d",
                        str(tmp_path), "--configfile", str(tmp_path / "c.yaml")], capture_output=True, text=True)
    assert r.returncode != 0 and "profile.objective: latency" in r.stdout + r.stderr


# --------------------------------------------------------------------------------------------
# The arithmetic, on the planted tiny tower (vision/224x224)
# --------------------------------------------------------------------------------------------

def _metric_pairs(eng, evals, ops_sets, tmp_path, integer: bool):
    """(engine estimate, built model) cosines for each set; built measured in the default
    (integer kernels) or a basic (fake quant) session against the float model."""
    from vlsens.core.metrics import Metrics
    from vlsens.core.onnxutil import make_session
    from vlsens.quantize.qdq import quantize

    session, reference = eng.session(evals), eng.reference()
    fl = make_session(eng.float_model)
    out = []
    for i, ops in enumerate(ops_sets):
        est = session.evaluate(ops, reference)
        m = quantize(eng.float_model, tmp_path / f"s{i}" / "model.onnx", ops, eng.settings, eng.cache)
        q = make_session(m, basic=not integer)
        acc = Metrics(False)
        for feed, valid in zip(evals.feeds, evals.valid):
            acc.add(q.run(None, feed)[0], fl.run(None, feed)[0], valid)
        out.append((est, acc.result()))
    return out


@pytest.fixture(scope="module")
def guarded(planted, tmp_path_factory):
    """The planted tower's engine with the run's settings for this machine (quant.target ort-cpu,
    quant.saturation auto) and, on a CPU whose U8S8 kernels saturate, one without the guard."""
    from vlsens.sensitivity.stages import prepare

    root = tmp_path_factory.mktemp("guarded")
    ev = planted / "calib" / "eval.npz"
    settings = {}
    for name, sat in (("run", "auto"), ("none", "none")):
        s = QuantSettings.from_config(resolve(_cfg(saturation=sat)))
        prepare(planted / "fp32" / "model.onnx", planted / "calib" / "calib.npz", ev, root / name, s, suffix_cuts=0,
                logits=False)
        settings[name] = s
    return root, settings


def test_integer_kernels_equal_the_engine_per_op_with_the_run_settings(planted, guarded, tmp_path):
    """Every op alone: the engine's number (fake quant) and quantize_static's one-op model in ORT's
    default session (integer kernels) agree to float rounding; the ranking is the same."""
    from vlsens.sensitivity.engine import Engine

    eng = Engine(guarded[0] / "run")
    evals = eng.samples(planted / "calib" / "eval.npz")
    names = [o.name for o in eng.ops]
    pairs = _metric_pairs(eng, evals, [[n] for n in names], tmp_path, integer=True)
    for n, (est, built) in zip(names, pairs):
        assert abs(est["cosine"] - built["cosine"]) <= 1e-6, n
        assert built["mse"] == pytest.approx(est["mse"], rel=0.02, abs=1e-12), n
    by_est = sorted(range(len(names)), key=lambda i: -pairs[i][0]["mse"])
    by_built = sorted(range(len(names)), key=lambda i: -pairs[i][1]["mse"])
    assert by_est[:3] == by_built[:3]


def test_integer_kernels_equal_the_estimate_of_op_sets_with_the_run_settings(planted, guarded, tmp_path):
    import random

    from vlsens.sensitivity.engine import Engine

    eng = Engine(guarded[0] / "run")
    evals = eng.samples(planted / "calib" / "eval.npz")
    names = [o.name for o in eng.ops]
    rng = random.Random(3)
    sets = [names] + [rng.sample(names, rng.randint(len(names) // 2, len(names))) for _ in range(3)]
    for est, built in _metric_pairs(eng, evals, sets, tmp_path, integer=True):
        # rounding of the requantized outputs differs by an ulp here and there: the gap is a
        # small fraction of the error itself (1e-4 at cosine 0.99 would be 1 %)
        assert abs(est["cosine"] - built["cosine"]) <= max(1e-6, 0.01 * (1 - est["cosine"])), (est, built)
        assert built["mse"] == pytest.approx(est["mse"], rel=0.01), (est, built)


def test_without_the_guard_the_integer_kernels_miss_the_estimate(planted, guarded, tmp_path):
    """The negative control: U8S8 with 8-bit weights on a CPU without VNNI saturates, and the
    all-INT8 model's integer result is worse than its estimate by more than the acceptance bound."""
    from vlsens.sensitivity.engine import Engine

    if not cpu_features()["u8s8_saturates"]:
        pytest.skip("this CPU accumulates integer dot products in 32 bits (VNNI / ARM): nothing saturates here")
    eng = Engine(guarded[0] / "none")
    evals = eng.samples(planted / "calib" / "eval.npz")
    [(est, built)] = _metric_pairs(eng, evals, [[o.name for o in eng.ops]], tmp_path, integer=True)
    assert est["cosine"] - built["cosine"] > 1e-4, (est, built)
    [(est_f, fake)] = _metric_pairs(eng, evals, [[o.name for o in eng.ops]], tmp_path / "f", integer=False)
    assert est_f["cosine"] == pytest.approx(fake["cosine"], abs=1e-9)  # in fake quant they are one number


# --------------------------------------------------------------------------------------------
# The profile's repair and latency candidates, as algorithms
# --------------------------------------------------------------------------------------------

class _FakeBuild:
    def __init__(self, ops, meets, dropped):
        self.ops, self.meets, self.extra = ops, meets, {"dropped": dropped}


class _FakeBuilder:
    """Meets the target when none of ``bad`` is INT8."""

    def __init__(self, bad):
        self.bad, self.builds = set(bad), []

    def build(self, ops, reason, dropped=None, **_):
        b = _FakeBuild(list(ops), not (set(ops) & self.bad), dropped)
        self.builds.append(b)
        return b


@pytest.mark.parametrize("n,bad", [(40, 3), (100, 1), (7, 7), (64, 10)])
def test_repair_finds_the_fewest_ops_to_drop_in_log2_builds(n, bad):
    import math

    from vlsens.precision.int8 import repair

    chosen = [f"op{i}" for i in range(n)]
    by_sensitivity = list(reversed(chosen))  # the last ops are the most sensitive
    builder = _FakeBuilder(by_sensitivity[:bad])
    made = repair(builder, chosen, by_sensitivity)
    assert len(made) <= math.ceil(math.log2(n))
    best = [b for b in made if b.meets]
    if bad < n:
        kept = max(best, key=lambda b: len(b.ops))
        assert set(kept.ops) == set(chosen) - set(by_sensitivity[:bad]) and kept.extra["dropped"] == bad
    else:
        assert not best  # every op is bad: nothing with an INT8 op meets


def test_latency_candidates_leave_the_smallest_ops_in_float():
    from vlsens.precision.int8 import latency_candidates

    weights = {"big": 800, "mid": 150, "small": 40, "tiny": 9, "act": 0}
    shipped = ["act", "tiny", "small", "mid", "big"]
    cands = latency_candidates(shipped, weights, (0.99, 0.95, 0.8, 0.5))
    sets = [set(s) for _, s in cands]
    assert sets == [{"big", "mid", "small"}, {"big", "mid"}, {"big"}]  # 0.8 and 0.5 both keep 'big' alone: one candidate
    assert all(list(s) == [o for o in shipped if o in set(s)] for _, s in cands)  # graph order kept
    assert np.isclose(cands[0][0], 0.99)
