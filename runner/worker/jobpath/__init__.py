"""A directory the supervisor puts first on the job's PYTHONPATH (only its sitecustomize.py is meant to be found
there): see sitecustomize.py. Nothing imports this package."""
