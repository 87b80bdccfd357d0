"""A tower that vlsens does not ship: the vision tower's patch merger alone (graph
``vision/merger``). tests/test_towers.py names it in a config (``towers:``) and gets every generic
stage for it; nothing in src/, rules/ or workflow/ knows it.

Input: ``hidden_states`` (N, hidden) float32, N a multiple of 4 (spatial merge 2 x 2); output:
``merged`` (N / 4, out_hidden). Parity and calibration inputs are seeded normal draws (the
merger's input scale does not matter for this demonstration)."""

from __future__ import annotations

import numpy as np

from vlsens.data.calibration import CalibrationSet
from vlsens.data.cases import Case, Cases
from vlsens.data.samples import Samples
from vlsens.export.towers.base import Tower


def _merger(checkpoint):
    from vlsens.model.loading import load_model

    return load_model(checkpoint).model.visual.merger.eval()


class MergerTower(Tower):
    kind = "merger"
    pattern = r"vision/merger"

    @classmethod
    def graphs(cls, config, spec=None):
        return ["vision/merger"]

    def reference(self, checkpoint, images, settings, device="cpu"):
        import torch

        merger = _merger(checkpoint)
        hidden = int(merger.ln_q.weight.shape[0])
        rng = np.random.default_rng(settings["seed"])
        cases = Cases(source="transformers Qwen2_5_VLPatchMerger (PyTorch, float32) on seeded normal inputs")
        for n in settings["tokens"]:
            x = rng.normal(size=(n, hidden)).astype(np.float32)
            with torch.no_grad():
                y = merger(torch.from_numpy(x)).numpy()
            cases.add(Case(f"{n}-tokens", "model.onnx", {"hidden_states": x}, y, meta={"tokens": n}))
        return cases

    def export(self, checkpoint, cases, workdir, settings):
        import torch

        from vlsens.core.onnxutil import resave

        merger = _merger(checkpoint)
        raw = workdir / "raw" / "model.onnx"
        raw.parent.mkdir(parents=True)
        example = torch.from_numpy(cases.cases[0].inputs["hidden_states"])
        with torch.no_grad():
            torch.onnx.export(torch.nn.Sequential(merger), (example,), str(raw), dynamo=False, opset_version=19,
                              input_names=["hidden_states"], output_names=["merged"],
                              dynamic_axes={"hidden_states": {0: "tokens"}, "merged": {0: "merged_tokens"}})
        return {"model.onnx": resave(raw, workdir / "model.onnx")}, {"exporter": "torch.onnx.export(dynamo=False)"}

    def calibration(self, checkpoint, inputs, settings):
        from transformers import AutoConfig

        hidden = int(AutoConfig.from_pretrained(str(checkpoint)).vision_config.hidden_size)
        rng = np.random.default_rng(settings["seed"] + 1)
        splits, samples = {}, []
        for split in ("calib", "eval"):
            n = settings[f"num_{split}"]
            feeds = [{"hidden_states": rng.normal(size=(64, hidden)).astype(np.float32)} for _ in range(n)]
            names = [f"{split}-{i}" for i in range(n)]
            splits[split] = Samples(feeds, None, names)
            samples += [{"name": m, "split": split, "index": i} for i, m in enumerate(names)]
        return CalibrationSet(splits, samples, {"seed": settings["seed"]})
