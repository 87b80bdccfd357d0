"""What NPU toolchains take (``rules/npu.smk``).

Single-file parts of the fixed-size vision graphs: :mod:`~vlsens.npu.cut` (where to cut, and the
parts written), :mod:`~vlsens.npu.chain` (the parts run one after another),
:mod:`~vlsens.npu.build` (the gated, published job) and :mod:`~vlsens.npu.calibration` (each
part's calibration archives). :mod:`~vlsens.npu.embeddings`: the token embedding table as raw
binaries. A toolchain's own files (its build config, its QDQ model) belong here, one module per
toolchain.
"""
