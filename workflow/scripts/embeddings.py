"""The token embedding table as raw binaries with a manifest (vlsens.npu.embeddings)."""
import _vlsens  # noqa: F401  (first: src/ on sys.path, the job's thread environment)

from vlsens.core.scripting import run
from vlsens.npu import embeddings

run(snakemake, lambda sm: embeddings.export_embeddings(  # noqa: F821
    sm.params.checkpoint, sm.output.embeddings, sm.params.dtypes))
