"""`runner bench`: the 'GPU vs TPU' notebook's experiment, our trainer against the notebook's plain model.fit.

    python -m runner.bench                       # batch 256, 512, 1024; 3 epochs each; full MNIST
    python -m runner.bench --quick               # a short run
    python -m runner.bench --framework jax       # Keras 3 on JAX only (numpy, jax and keras suffice: no TensorFlow)
    python -m runner.bench --compare a/ --compare b/bench.json --out both/   # several runs side by side

    notebook.py   the notebook's published K80 GPU and TPU v2-8 numbers
    arms.py       the two trainers, each running one epoch on request, on TensorFlow or JAX (both live here)
    harness.py    the driver: per batch size, epochs interleaved between the two, in worker processes
    report.py     bench.json, bench.md, bench.svg, and the side-by-side comparison
    command.py    the typer command `bench` for the runner CLI

By default each engine installed here runs (TensorFlow, then JAX), each its own table. Importing this package imports
neither TensorFlow nor JAX; the plot is SVG drawn by runner.collect.svg.
"""
