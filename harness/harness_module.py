"""Loads another harness script as a module (`load("bench-cluster")`): their
file names have dashes, which `import` does not take."""

import importlib.util
import os

HARNESS = os.path.dirname(os.path.abspath(__file__))


def load(name):
    path = os.path.join(HARNESS, f"{name}.py")
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
