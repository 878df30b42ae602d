import os
import sys

# Test tools and envs live in agentic_tools.py next to this file; workers (and the tool sandbox,
# through PYTHONPATH) inherit sys.path from the controller.
sys.path.insert(0, os.path.dirname(__file__))
