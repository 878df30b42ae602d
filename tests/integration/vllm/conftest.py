import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # vllm_venv.py: the tests' shared venv helper (--import-mode=importlib)
