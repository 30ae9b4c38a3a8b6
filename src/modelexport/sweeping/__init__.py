"""The compile matrix (`modelexport sweep`): models × targets × precisions, one bundle per cell,
run locally or on a Ray cluster, with a results table sorted by what to ship per SoC. Named
`sweeping` because a subpackage `modelexport.sweep` would replace the API function of that name.

    matrix.py     the matrix file, checked whole before any work
    cells.py      a cell and how one runs (the same compile as the CLI's, then a rename)
    resources.py  what a cell asks of the machine (LLMs: the up-front estimate; ONNX / PyTorch: a measured rule)
    executors.py  local processes or Ray tasks: the one thing that differs between them
    results.py    a cell's row from its manifest; the sort; results.json / .csv
    page.py       OUT/report.html
    run.py        the order of work, retries, progress
"""
