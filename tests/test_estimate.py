"""The decoder's estimate (``plan.decoder_measured``): each MatMul's output error at each width,
taken from the float model's own inputs, and engine nbits measuring only some MatMuls and
pricing the others by it."""

import numpy as np
import pytest

from vlsens.core.onnxgraph import dequantize_matmulnbits
from vlsens.core.onnxutil import make_session, tensor_array
from vlsens.quantize.nbits import NBitsSettings
from vlsens.sensitivity import estimate
from vlsens.sensitivity import nbits as nb


@pytest.fixture(scope="module")
def engine(graph_builder, tmp_path_factory):
    b = graph_builder("decoder")
    folder = tmp_path_factory.mktemp("estimate") / "engine"
    nb.prepare(b.model("fp32"), b.calib / "eval.npz", folder, NBitsSettings(algorithm="k_quant", block_size=32),
               threads=2, logits=True)
    return b, folder


def test_output_errors_are_the_products_of_each_matmuls_own_input_by_its_weight_change(engine, tmp_path):
    """Checked against an independent computation: the float model run with every MatMul's input
    as an output (a session of its own), times the weight ONNX Runtime's MatMulNBits spec says
    the node multiplies by, for every op and width."""
    import onnx
    from onnx import helper

    from vlsens.data.samples import Samples

    _, folder = engine
    eng_dir = nb.Prepared(folder)
    fl = folder / nb.FILES["float"]
    samples = Samples.load(engine[0].calib / "eval.npz", fl)
    inputs = estimate.capture(fl, samples.feeds, eng_dir.meta["ops"], tmp_path, threads=2)
    got = estimate.output_errors(inputs, fl, {b: folder / nb.FILES[f"q{b}"] for b in (4, 8)}, eng_dir.meta["ops"])

    m = onnx.load(str(fl), load_external_data=False)
    node_input = {n.name: n.input[0] for n in m.graph.node if n.input}
    inits = {i.name: i for i in m.graph.initializer}
    names = sorted({node_input[o["name"]] for o in eng_dir.meta["ops"]})
    for t in names:
        m.graph.output.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    probe = folder / "probe-outputs.onnx"
    onnx.save(m, str(probe))
    sess = make_session(probe, threads=2)
    rows = {t: [] for t in names}
    for feed in samples.feeds:
        for t, x in zip(names, sess.run(names, feed), strict=True):
            rows[t].append(x.reshape(-1, x.shape[-1]).astype(np.float64))
    del sess
    probe.unlink()
    x_all = {t: np.concatenate(v) for t, v in rows.items()}
    assert len(got) == 15
    for b in (4, 8):
        for name, wq in dequantize_matmulnbits(folder / nb.FILES[f"q{b}"]):
            o = next(o for o in eng_dir.meta["ops"] if o["name"] == name)
            w = tensor_array(inits[o["weight"]], fl.parent).astype(np.float64)
            want = float(np.sum((x_all[node_input[name]] @ (wq.astype(np.float64) - w)) ** 2))
            assert got[name][str(b)] == pytest.approx(want, rel=1e-4), (name, b)
            assert want > 0
        # INT8 changes every weight less than INT4: its output error is smaller, op by op
    assert all(got[n]["8"] < got[n]["4"] for n in got)


def test_measuring_some_matmuls_keeps_their_rows_and_estimates_the_others(engine, tmp_path):
    import pandas as pd

    b, folder = engine
    nb.sensitivity(folder, b.calib / "eval.npz", tmp_path / "all.csv", tmp_path / "all.json", 2)
    summary = nb.sensitivity(folder, b.calib / "eval.npz", tmp_path / "some.csv", tmp_path / "some.json", 2, measured=9)
    exact = pd.read_csv(tmp_path / "all.csv").set_index("op")
    some = pd.read_csv(tmp_path / "some.csv").set_index("op").loc[exact.index]
    assert int(some["measured"].sum()) == 9 and len(some) == 15
    done, rest = some[some["measured"] == 1], some[some["measured"] == 0]
    # the measured rows are the engine's measure, exactly (the same session, the same assignment)
    for col in ("error_int4", "error_int8", "kl_int4", "kl_int8", "cosine_int4", "top1_int4"):
        assert np.allclose(done[col], exact.loc[done.index, col], rtol=1e-7, atol=0), col
    # per role the MatMul of largest INT4 output error is measured: lm_head, one of each projection
    assert "/lm_head/MatMul" in done.index
    assert {r for r in done["role"]} == set(some["role"])
    by_role = some.groupby("role")["output_error_int4"].idxmax()
    assert set(by_role) <= set(done.index)
    # the others: their estimate, from their own output error, positive; cosine and top-1 unknown
    assert (rest["error_int4"] == rest["estimate_int4"]).all() and (rest["error_int4"] > 0).all()
    assert (rest["kl_int8"] == rest["estimate_int8"]).all()
    assert rest["cosine_int4"].isna().all() and rest["top1_int8"].isna().all()
    assert (rest["output_error_int8"] < rest["output_error_int4"]).all()
    # an estimated row is its role's scale times its output error: two rows of a role share the ratio
    rec = summary["estimate"]
    assert rec["measured"] == 9 and rec["estimated"] == 6 and set(rec["widths"]) == {"4", "8"}
    for role, grp in some.groupby("role"):
        ratios = (grp["estimate_int4"] / grp["output_error_int4"]).to_numpy()
        if not rec["widths"]["4"]["depth"]["used"]:
            est = grp[grp["measured"] == 0]
            assert np.allclose(est["estimate_int4"] / est["output_error_int4"], rec["widths"]["4"]["scales"][role]), role
        assert np.isfinite(ratios).all()
    # the whole models are measured either way
    full = __import__("json").loads((tmp_path / "all.json").read_text())
    assert summary["all_int4"] == full["all_int4"] and summary["all_int8"] == full["all_int8"]


def test_measuring_every_matmul_writes_the_table_as_before(engine, tmp_path):
    """``measured`` at or above the MatMuls' number is the full measure: no estimate columns."""
    import pandas as pd

    b, folder = engine
    summary = nb.sensitivity(folder, b.calib / "eval.npz", tmp_path / "n.csv", tmp_path / "n.json", 2, measured=15)
    assert "estimate" not in summary and "measured" not in pd.read_csv(tmp_path / "n.csv").columns


def test_the_fit_takes_one_scale_per_role_and_the_depth_term_where_it_predicts_better():
    """Synthetic rows: KL = role scale x output error x a factor per depth; with every role
    measured at three depths the depth term is taken and the unmeasured rows are priced exactly."""
    roles = {"attn.q_proj": 1e-3, "mlp.down_proj": 1e-1}
    rows, errors = [], {}
    for layer in range(8):
        for role, scale in roles.items():
            op = f"/model/layers.{layer}/{role.replace('.', '/')}/MatMul"
            e = 1.0 + layer
            kl = scale * e * np.exp(-0.5 * layer / 7)
            errors[op] = {"4": e, "8": e / 16}
            rows.append({"op": op, "measured": int(layer in (0, 3, 7)), "error_int4": kl, "error_int8": kl / 16,
                         "true": kl})
    rec = estimate.estimate_widths(rows, errors, (4, 8), logits=True)
    assert rec["widths"]["4"]["depth"]["used"] and rec["widths"]["4"]["rank_correlation"] == pytest.approx(1.0)
    for r in rows:
        assert r["error_int4"] == pytest.approx(r["true"], rel=1e-9)
        if not r["measured"]:
            assert r["kl_int4"] == r["error_int4"] and r["estimate_int4"] == r["error_int4"]
    # measured / estimate, held out, is exact too
    assert rec["widths"]["4"]["measured_over_estimate"]["max"] == pytest.approx(1.0)


def test_the_decoder_measured_key_is_checked():
    from conftest import default_config

    from vlsens.config import schema_errors

    def cfg(v):
        return default_config(**{"plan.decoder_measured": v})

    assert not schema_errors(cfg(24)) and not schema_errors(cfg("all"))
    (zero,) = schema_errors(cfg(0))
    assert zero.startswith("plan.decoder_measured: 0 ") and "minimum of 1" in zero, zero
    (word,) = schema_errors(cfg("some"))
    assert "'some' is not of type 'integer'" in word and "['all']" in word, word


def test_the_tiny_preset_takes_more_decoder_layers(tmp_path):
    from vlsens.core.errors import ConfigError
    from vlsens.model.presets.build import make_tiny_model
    from vlsens.model.presets.tables import check_tiny_outliers

    model, _ = make_tiny_model(seed=0, text_layers=5)
    assert model.config.text_config.num_hidden_layers == 5 and len(model.model.language_model.layers) == 5
    check_tiny_outliers({"text_layers": 5, "text_outlier": {"layer": 4}})
    with pytest.raises(ConfigError, match=r"model.tiny.text_outlier.layer: 5 is not a text layer \(0..4\)"):
        check_tiny_outliers({"text_layers": 5, "text_outlier": {"layer": 5}})


def test_algorithms_are_chosen_by_output_error_when_estimating(engine, tmp_path):
    """With ``Scoring(measured=...)`` each op's algorithm per width is the one of least output error
    (the estimate's price is one scale times it); the uniform models are still measured."""
    b, _ = engine
    kq = NBitsSettings(algorithm="k_quant", block_size=32)
    choice = nb.choose_algorithms(b.model("fp32"), b.calib / "eval.npz", kq, ["rtn"], tmp_path / "work", 2,
                                  logits=True, scoring=nb.Scoring(measured=9))
    assert choice["scored_by"] == "output error"
    errors = choice["errors"]
    assert set(errors) == {"k_quant", "rtn"} and all(v["4"] > v["8"] > 0 for a in errors.values() for v in a.values())
    for w in ("4", "8"):
        for op in errors["k_quant"]:
            best = min(choice["allowed"][w], key=lambda a: (errors[a][op][w], a != "k_quant"))
            assert choice["chosen"].get(w, {}).get(op, "k_quant") == best, (op, w)
    # k_quant fits each block's scale to its weights: its output error is below round to nearest's on most ops
    assert sum(errors["k_quant"][op]["4"] < errors["rtn"][op]["4"] for op in errors["k_quant"]) > len(errors["rtn"]) // 2
    assert set(choice["uniform"]) == {"k_quant", "rtn"} and all(choice["uniform"][a]["4"] > 0 for a in ("k_quant", "rtn"))


def test_the_engine_built_with_the_choice_takes_its_output_errors_from_it(engine, tmp_path, monkeypatch):
    """``budget_nbits`` with ``plan.algorithms: [gptq]`` and ``plan.decoder_measured``: the choice
    scores each MatMul by its output error; the engine built with the choice (the default's
    MatMuls reused, GPTQ's read from the store) writes the same table when it takes those errors
    (:func:`chosen_errors`, no capture or error pass of its own) as when it computes them again.
    Errors that do not match the engine are refused."""
    import pandas as pd

    from vlsens.core import records
    from vlsens.quantize import gptq

    b, folder = engine
    fp32, calib, evaluation = b.model("fp32"), b.calib / "calib.npz", b.calib / "eval.npz"
    kq, store, work = NBitsSettings(algorithm="k_quant", block_size=32, accuracy_level=4), tmp_path / "gptq", \
        tmp_path / "work"
    choice = nb.choose_algorithms(fp32, evaluation, kq, ["gptq"], work, 2, logits=True, scoring=nb.Scoring(measured=9),
                                  calibration=gptq.Calibration(calib, gptq.Store(store, fp32, calib, True)))
    assert choice["scored_by"] == "output error" and choice["chosen"].get("4"), choice["chosen"]
    eng = tmp_path / "engine"
    nb.prepare(fp32, evaluation, eng, kq, 2, logits=True,
               how=nb.Quantizing({int(w): a for w, a in choice["chosen"].items()},
                                 gptq.Calibration(calib, gptq.Store(store, fp32, calib)), nb.reuse_of(work / "k_quant", fp32)))
    (tmp_path / "computed").mkdir(), (tmp_path / "taken").mkdir()
    computed = nb.sensitivity(eng, evaluation, tmp_path / "computed" / "nbits.csv", tmp_path / "computed" / "nbits.json",
                              2, measured=9)
    errors = nb.chosen_errors(choice, eng)
    monkeypatch.setattr(nb, "_output_errors", lambda *a, **k: pytest.fail("output errors computed a second time"))
    taken = nb.sensitivity(eng, evaluation, tmp_path / "taken" / "nbits.csv", tmp_path / "taken" / "nbits.json", 2,
                           measured=9, errors=errors)
    assert computed["output_errors"] == "computed" and taken["output_errors"] == "from the algorithm choice"
    want, got = (pd.read_csv(tmp_path / d / "nbits.csv").set_index("op") for d in ("computed", "taken"))
    assert list(got.index) == list(want.index) and list(got.columns) == list(want.columns)
    for col in ("output_error_int4", "output_error_int8", "measured", "rank"):
        assert (got[col] == want[col]).all(), col  # the very values: same inputs, same quantized MatMuls
    for col in got.columns.drop(["role"]):
        assert np.allclose(got[col], want[col], rtol=1e-7, atol=0, equal_nan=True), col
    # the GPTQ MatMuls' errors are GPTQ's, the others the default's
    at4 = choice["chosen"]["4"]
    assert all(errors[op]["4"] == choice["errors"]["gptq"][op]["4"] for op in at4)
    assert all(errors[op]["4"] == choice["errors"]["k_quant"][op]["4"] for op in errors if op not in at4)
    assert records.errors(tmp_path / "taken" / "nbits.json") == []
    # errors that are not this engine's: refused, not used
    with pytest.raises(ValueError, match="not built with the algorithm choice"):
        nb.chosen_errors(choice, folder)  # the k_quant engine: no op by GPTQ
    short = {op: v for op, v in errors.items() if op != "/lm_head/MatMul"}
    with pytest.raises(ValueError, match=r"missing \['/lm_head/MatMul'\]"):
        nb.sensitivity(eng, evaluation, tmp_path / "x.csv", tmp_path / "x.json", 2, measured=9, errors=short)
    with pytest.raises(ValueError, match="price_on"):
        nb.sensitivity(eng, evaluation, tmp_path / "x.csv", tmp_path / "x.json", 2, measured=9, errors=errors,
                       price_on=["x"])
    assert nb.chosen_errors({**choice, "scored_by": "measured error"}, eng) is None
