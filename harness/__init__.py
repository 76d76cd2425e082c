"""thinwire's experiment machinery, shared by the pipelines and the papers: emulated networks
(netem), the communication cost model, run-folder locks, verdicts and claims, the reports' shared
code, a pipeline's params and result folders.

Imports ``common``; never ``papers`` or ``pipelines``.
"""
