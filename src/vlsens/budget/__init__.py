"""The whole-VLM plan: which decoder bits, vision format and embedding format to ship at each
size, chosen on the folders' measure (:mod:`vlsens.deploy.measure`) and built.

A deploy folder is three graphs, and its size and its answers depend on all three: the decoder
(every weight MatMul float, INT8 or INT4), the vision graph and the embedding table. Each part's
error is measured on the folders' own cases: the decoder's for any assignment exactly, in the
``nbits`` engine (:mod:`vlsens.sensitivity.nbits`) on the measure's cases run through the fp32
folder's graphs (:mod:`vlsens.deploy.genai.chain`); each vision and embedding format end to end
with the other parts float.

:mod:`.plan` (a :class:`~vlsens.budget.plan.Plan`: the file that rebuilds one folder exactly, and
the decoder it builds), :mod:`.front` (the search: the decoder's error against its bytes,
combined with the vision and embedding formats into the estimated front, plans picked along it
and at each anchor's bytes), :mod:`.build` (the jobs: the parts' formats measured, the search's
files, a plan's folder), :mod:`.report` (the measured front beside the anchors, the
recommendation). ``python -m vlsens.budget RESULTS/<model>`` prints the recommendation of a
finished run.
"""
