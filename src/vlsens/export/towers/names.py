"""The builtin towers' graph and file names that other packages compose without running the
towers (the deploy folders are made of the decoder and the dynamic vision graph). Nothing is
imported here: a job's code hash covers every module it imports, so naming a graph must not make
a job depend on that tower's code."""

#: the decoder tower's graph, and its embedding graph's file (onnxruntime-genai's name)
DECODER = "decoder"
DECODER_EMBEDDING = "embedding.onnx"
#: the dynamic vision tower's graph
VISION_DYNAMIC = "vision/dynamic"
