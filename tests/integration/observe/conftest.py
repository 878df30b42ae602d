import os
import sys

# Test actors live in obs_actors.py next to this file; workers inherit sys.path from the controller.
sys.path.insert(0, os.path.dirname(__file__))
