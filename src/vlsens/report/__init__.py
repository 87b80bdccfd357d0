"""The workflow's report: figures (:mod:`vlsens.report.figures`) and HTML tables
(:mod:`vlsens.report.tables`) made from the records the other stages write, marked for
``snakemake --report`` by ``rules/report.smk``.

Every function here reads plain data (rows of a sensitivity CSV, the JSON/YAML records) and
writes one static file, so each can be rendered from a small fixed input in a unit test.
"""

from pathlib import PurePosixPath

#: The report's categories in the order the report shows them, each with the files that belong to
#: it (``paths.FIGURE_FILES`` / ``paths.REPORT_FILES`` names, ``fp16-fallback.png``).
CATEGORIES = (
    ("Parity and profiles", ("parity.html", "profiles.html")),
    ("Sensitivity heatmaps", ("heatmap.png",)),
    ("Most sensitive ops", ("ranked-*.png",)),
    ("Profiles: INT8 coverage vs accuracy", ("pareto.png",)),
    ("Engine agreement", ("engines.png",)),
    ("FP16 fallback", ("fp16-fallback.png",)),
    ("Latency and size", ("latency.png",)),
    ("INT4 decoders", ("int4-pareto.png", "nbits-heatmap.png")),
    ("Whole-VLM plan", ("front.png",)),
)


def numbered_categories(targets) -> dict[str, str]:
    """Category name -> ``"N. name"``, numbered 1, 2, ... over the categories a run draws (one of
    its ``targets`` is a file of the category), so the report's menu has no gap; a category the run
    does not draw keeps its name unnumbered (no file of the run is filed under it)."""
    names = [PurePosixPath(str(t)).name for t in targets]
    drawn = [c for c, files in CATEGORIES if any(PurePosixPath(n).match(f) for n in names for f in files)]
    out = {c: c for c, _ in CATEGORIES}
    out.update({c: f"{i}. {c}" for i, c in enumerate(drawn, 1)})
    return out
